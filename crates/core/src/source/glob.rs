//! File patterns (`*`, `?`, `[abc]`, `[a-z]`, `[!abc]` within a path component, `**` for any
//! number of directories), expanded under an access policy: a directory is listed, and a file
//! is taken, only if the policy allows its real path (symlinks resolved), so a pattern cannot
//! reach what the database may not (DuckDB's `enable_external_access` / `allowed_directories`).

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// Says whether a path (absolute, symlinks resolved) may be listed or read; the error says why
/// not.
pub type PathPolicy = Arc<dyn Fn(&Path) -> Result<(), String> + Send + Sync>;

/// `path` made absolute (against the working directory) with `.` and `..` resolved by name,
/// without touching the file system.
pub fn lexical_absolute(path: &Path) -> PathBuf {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .unwrap_or_else(|_| PathBuf::from("/"))
            .join(path)
    };
    let mut out = PathBuf::from("/");
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

pub(crate) fn has_wildcard(c: &str) -> bool {
    c.contains(['*', '?', '['])
}

/// The part of a pattern before its first wildcard component (the directory its matches are
/// under, or the file itself when there is no wildcard), made absolute and normalised.
pub fn fixed_prefix(pattern: &str) -> PathBuf {
    let mut prefix = PathBuf::new();
    if pattern.starts_with('/') {
        prefix.push("/");
    }
    for c in pattern.split('/').filter(|c| !c.is_empty()) {
        if has_wildcard(c) {
            break;
        }
        prefix.push(c);
    }
    lexical_absolute(&prefix)
}

/// The files `pattern` matches, sorted by path; directories and files the policy refuses are
/// errors (never silently skipped: the user asked for them).
pub fn glob(pattern: &str, policy: Option<&PathPolicy>) -> Result<Vec<PathBuf>, String> {
    let absolute = pattern.starts_with('/');
    let components: Vec<&str> = pattern.split('/').filter(|c| !c.is_empty()).collect();
    if components.is_empty() {
        return Err(format!("empty file pattern '{pattern}'"));
    }
    let root = if absolute {
        PathBuf::from("/")
    } else {
        PathBuf::new()
    };
    let mut out = Vec::new();
    walk(&root, &components, policy, &mut out)?;
    out.sort();
    out.dedup();
    Ok(out)
}

/// Checks the policy for `path` (its real path, when it exists).
pub(crate) fn allowed(policy: Option<&PathPolicy>, path: &Path) -> Result<(), String> {
    let Some(policy) = policy else {
        return Ok(());
    };
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| lexical_absolute(path));
    policy(&real)
}

fn walk(
    dir: &Path,
    rest: &[&str],
    policy: Option<&PathPolicy>,
    out: &mut Vec<PathBuf>,
) -> Result<(), String> {
    let Some((&first, tail)) = rest.split_first() else {
        if dir.is_file() {
            allowed(policy, dir)?;
            out.push(dir.to_path_buf());
        }
        return Ok(());
    };
    let list = |d: &Path| -> Result<Vec<(String, PathBuf)>, String> {
        let d = if d.as_os_str().is_empty() {
            Path::new(".")
        } else {
            d
        };
        allowed(policy, d)?;
        let mut v: Vec<(String, PathBuf)> = std::fs::read_dir(d)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.file_name()))
            .map(|(n, os)| (n, os.into()))
            .collect();
        v.sort();
        Ok(v)
    };
    if first == "**" {
        // Zero directories, then one more level of any directory.
        walk(dir, tail, policy, out)?;
        for (name, os) in list(dir)? {
            let next = dir.join(os);
            if next.is_dir() && !name.starts_with('.') {
                walk(&next, rest, policy, out)?;
            }
        }
    } else if has_wildcard(first) {
        for (name, os) in list(dir)? {
            if wildcard_match(first.as_bytes(), name.as_bytes()) {
                walk(&dir.join(os), tail, policy, out)?;
            }
        }
    } else {
        let next = dir.join(first);
        if tail.is_empty() || next.is_dir() {
            walk(&next, tail, policy, out)?;
        }
    }
    Ok(())
}

/// Shell-style matching of one path component.
pub(crate) fn wildcard_match(pat: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pat.len() {
            match pat[p] {
                b'*' => {
                    star = Some((p, n));
                    p += 1;
                    continue;
                }
                b'?' => {
                    p += 1;
                    n += 1;
                    continue;
                }
                b'[' => {
                    if let Some((matched, len)) = class_match(&pat[p..], name[n]) {
                        if matched {
                            p += len;
                            n += 1;
                            continue;
                        }
                    } else if name[n] == b'[' {
                        p += 1;
                        n += 1;
                        continue;
                    }
                }
                c if c == name[n] => {
                    p += 1;
                    n += 1;
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some((sp, sn)) => {
                p = sp + 1;
                n = sn + 1;
                star = Some((sp, sn + 1));
            }
            None => return false,
        }
    }
    pat[p..].iter().all(|&c| c == b'*')
}

/// Matches `c` against the class at the start of `pat` (`[...]`); returns (matched, class
/// length), or None when the bracket is not a complete class.
fn class_match(pat: &[u8], c: u8) -> Option<(bool, usize)> {
    let mut i = 1;
    let negate = matches!(pat.get(1), Some(b'!' | b'^'));
    if negate {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    while i < pat.len() {
        if pat[i] == b']' && !first {
            return Some((matched != negate, i + 1));
        }
        first = false;
        if pat.get(i + 1) == Some(&b'-') && pat.get(i + 2).is_some_and(|&e| e != b']') {
            if pat[i] <= c && c <= pat[i + 2] {
                matched = true;
            }
            i += 3;
        } else {
            if pat[i] == c {
                matched = true;
            }
            i += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards() {
        assert!(wildcard_match(b"orders-*.ndjson", b"orders-1.ndjson"));
        assert!(wildcard_match(b"*", b""));
        assert!(!wildcard_match(b"orders-?.ndjson", b"orders-10.ndjson"));
        assert!(wildcard_match(b"p[0-3].json", b"p2.json"));
        assert!(!wildcard_match(b"p[!0-3].json", b"p2.json"));
        assert!(wildcard_match(b"*a*b", b"xxaxxb"));
        assert!(!wildcard_match(b"*a*b", b"xxaxxbc"));
    }

    #[test]
    fn prefixes_are_absolute_and_normalised() {
        assert_eq!(fixed_prefix("/a/b/../c/*.json"), PathBuf::from("/a/c"));
        assert_eq!(fixed_prefix("/a/./b/x.json"), PathBuf::from("/a/b/x.json"));
        assert_eq!(
            fixed_prefix("/a/../../etc/passwd"),
            PathBuf::from("/etc/passwd")
        );
        assert!(fixed_prefix("rel/*.json").is_absolute());
    }

    #[test]
    fn recursive_glob_and_a_policy_that_refuses_a_directory() {
        let d = std::env::temp_dir().join(format!("setl-glob-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("x/y")).unwrap();
        std::fs::create_dir_all(d.join("secret")).unwrap();
        std::fs::write(d.join("top.ndjson"), b"").unwrap();
        std::fs::write(d.join("x/y/deep.ndjson"), b"").unwrap();
        std::fs::write(d.join("secret/s.ndjson"), b"").unwrap();
        let all = glob(&format!("{}/**/*.ndjson", d.display()), None).unwrap();
        assert_eq!(all.len(), 3);
        let real = std::fs::canonicalize(&d).unwrap();
        let forbidden = real.join("secret");
        let policy: PathPolicy = Arc::new(move |p: &Path| {
            if p.starts_with(&forbidden) {
                Err(format!("'{}' is not allowed", p.display()))
            } else {
                Ok(())
            }
        });
        let e = glob(&format!("{}/**/*.ndjson", d.display()), Some(&policy)).unwrap_err();
        assert!(e.contains("secret"), "{e}");
        assert_eq!(
            glob(&format!("{}/x/**/*.ndjson", d.display()), Some(&policy))
                .unwrap()
                .len(),
            1
        );
        let _ = std::fs::remove_dir_all(d);
    }
}
