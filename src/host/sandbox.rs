//! DuckDB's sandbox as the extension honours it: with `enable_external_access = false`, only
//! paths under `allowed_directories` or in `allowed_paths` may be read or written, and no
//! network connection is made. Read from the calling connection at every bind, so a setting
//! changed between runs holds for the next one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use streaming_etl_core::{fixed_prefix, glob, lexical_absolute, EtlError, PathPolicy, Result};

use crate::host::args::{Arg, Args};

/// A path the operator allowed, as written (normalised by name) and as it resolves (symlinks
/// followed), so that neither `..` nor a symlink leads out of it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Allowed {
    lexical: PathBuf,
    real: PathBuf,
}

impl Allowed {
    fn new(text: &str) -> Allowed {
        let lexical = lexical_absolute(Path::new(text));
        let real = resolve(&lexical);
        Allowed { lexical, real }
    }
}

/// `path` with symlinks resolved as far as it exists; the part that does not exist yet (a
/// checkpoint file about to be created) is appended by name.
fn resolve(path: &Path) -> PathBuf {
    let mut missing = Vec::new();
    let mut cur = path.to_path_buf();
    loop {
        if let Ok(real) = std::fs::canonicalize(&cur) {
            let mut out = real;
            for name in missing.iter().rev() {
                out.push(name);
            }
            return out;
        }
        match (cur.file_name().map(|n| n.to_os_string()), cur.parent()) {
            (Some(name), Some(parent)) => {
                missing.push(name);
                cur = parent.to_path_buf();
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// The access the calling connection allows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sandbox {
    /// `enable_external_access = false`.
    locked: bool,
    dirs: Vec<Allowed>,
    paths: Vec<Allowed>,
}

fn text_list(a: Option<Arg>) -> Vec<String> {
    match a {
        Some(Arg::List(items)) => items
            .into_iter()
            .filter_map(|i| match i {
                Arg::Text(t) if !t.trim().is_empty() => Some(t),
                _ => None,
            })
            .collect(),
        Some(Arg::Text(t)) if !t.trim().is_empty() => vec![t],
        _ => Vec::new(),
    }
}

const WHY: &str = "enable_external_access is false";

impl Sandbox {
    /// Reads the calling connection's settings.
    pub fn read(args: &dyn Args) -> Sandbox {
        let locked = matches!(
            args.setting("enable_external_access"),
            Some(Arg::Bool(false))
        );
        if !locked {
            return Sandbox::default();
        }
        Sandbox {
            locked,
            dirs: text_list(args.setting("allowed_directories"))
                .iter()
                .map(|d| Allowed::new(d))
                .collect(),
            paths: text_list(args.setting("allowed_paths"))
                .iter()
                .map(|p| Allowed::new(p))
                .collect(),
        }
    }

    #[cfg(test)]
    pub fn locked(&self) -> bool {
        self.locked
    }

    /// Whether `path` (as written) and what it resolves to (`real`) are both inside what is
    /// allowed.
    fn permits(&self, lexical: &Path, real: &Path) -> bool {
        !self.locked
            || self
                .dirs
                .iter()
                .any(|d| lexical.starts_with(&d.lexical) && real.starts_with(&d.real))
            || self
                .paths
                .iter()
                .any(|p| lexical == p.lexical && real == p.real)
    }

    fn denied(what: &str, path: &Path) -> String {
        format!(
            "{WHY}: {what} '{}' is not under allowed_directories or in allowed_paths",
            path.display()
        )
    }

    /// The policy a file source lists directories and opens files under: the path it is given
    /// is already resolved, so it must be inside what is allowed once resolved.
    pub fn path_policy(&self) -> Option<PathPolicy> {
        if !self.locked {
            return None;
        }
        let me = self.clone();
        Some(Arc::new(move |real: &Path| {
            let inside = me.dirs.iter().any(|d| real.starts_with(&d.real))
                || me.paths.iter().any(|p| real == p.real);
            if inside {
                Ok(())
            } else {
                Err(Sandbox::denied("path", real))
            }
        }))
    }

    /// A `file:` source: the pattern's fixed directory (or file) and every file it matches
    /// now must be allowed; checked before anything is opened.
    pub fn check_files(&self, pattern: &str) -> Result<()> {
        if !self.locked {
            return Ok(());
        }
        let prefix = fixed_prefix(pattern);
        if !self.permits(&prefix, &resolve(&prefix)) {
            return Err(EtlError::Denied(Sandbox::denied("path", &prefix)));
        }
        glob(pattern, self.path_policy().as_ref()).map_err(EtlError::Denied)?;
        Ok(())
    }

    /// A Kafka source connects to brokers: refused outright.
    pub fn check_network(&self, brokers: &str) -> Result<()> {
        if self.locked {
            return Err(EtlError::Denied(format!(
                "{WHY}: a Kafka source would connect to brokers '{brokers}'"
            )));
        }
        Ok(())
    }

    /// A checkpoint file named by the user (the default one beside the database is the
    /// database's own state and is always allowed).
    pub fn check_checkpoint(&self, path: &str) -> Result<()> {
        let lexical = lexical_absolute(Path::new(path));
        if self.permits(&lexical, &resolve(&lexical)) {
            Ok(())
        } else {
            Err(EtlError::Denied(Sandbox::denied("checkpoint", &lexical)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Settings(HashMap<&'static str, Arg>);

    impl Args for Settings {
        fn positional(&self, _: usize) -> Option<Arg> {
            None
        }
        fn named(&self, _: &str) -> Option<Arg> {
            None
        }
        fn setting(&self, name: &str) -> Option<Arg> {
            self.0.get(name).cloned()
        }
    }

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("se-sandbox-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn locked(dirs: &[&Path], paths: &[&Path]) -> Sandbox {
        let list = |v: &[&Path]| {
            Arg::List(
                v.iter()
                    .map(|p| Arg::Text(p.display().to_string()))
                    .collect(),
            )
        };
        Sandbox::read(&Settings(HashMap::from([
            ("enable_external_access", Arg::Bool(false)),
            ("allowed_directories", list(dirs)),
            ("allowed_paths", list(paths)),
        ])))
    }

    #[test]
    fn open_access_allows_everything() {
        let s = Sandbox::read(&Settings(HashMap::from([(
            "enable_external_access",
            Arg::Bool(true),
        )])));
        assert!(!s.locked());
        s.check_files("/etc/passwd").unwrap();
        s.check_network("localhost:9092").unwrap();
        s.check_checkpoint("/anywhere/x.sqlite").unwrap();
    }

    #[test]
    fn files_outside_or_escaping_are_refused() {
        let d = tmpdir("files");
        let allowed = d.join("allowed");
        std::fs::create_dir_all(&allowed).unwrap();
        std::fs::write(allowed.join("a.ndjson"), "{}\n").unwrap();
        std::fs::write(d.join("secret.ndjson"), "{}\n").unwrap();
        let s = locked(&[&allowed], &[]);
        s.check_files(&format!("{}/*.ndjson", allowed.display()))
            .unwrap();
        let err = |p: String| s.check_files(&p).unwrap_err().to_string();
        assert!(err(format!("{}/secret.ndjson", d.display())).contains("enable_external_access"));
        assert!(err(format!("{}/../secret.ndjson", allowed.display()))
            .contains("enable_external_access"));
        std::fs::create_dir_all(allowed.join("sub")).unwrap();
        assert!(err(format!("{}/*/../../*.ndjson", allowed.display())).contains("is not under"));
        std::os::unix::fs::symlink(d.join("secret.ndjson"), allowed.join("link.ndjson")).unwrap();
        assert!(err(format!("{}/*.ndjson", allowed.display())).contains("secret.ndjson"));
        assert!(err("/etc/passwd".into()).contains("'/etc/passwd'"));
    }

    #[test]
    fn allowed_paths_are_exact() {
        let d = tmpdir("paths");
        std::fs::write(d.join("a.ndjson"), "{}\n").unwrap();
        std::fs::write(d.join("b.ndjson"), "{}\n").unwrap();
        let s = locked(&[], &[&d.join("a.ndjson")]);
        s.check_files(&format!("{}/a.ndjson", d.display())).unwrap();
        assert!(s.check_files(&format!("{}/b.ndjson", d.display())).is_err());
        // Listing the directory is not allowed by one allowed file in it.
        assert!(s.check_files(&format!("{}/*.ndjson", d.display())).is_err());
    }

    #[test]
    fn kafka_and_checkpoints() {
        let d = tmpdir("ckpt");
        let s = locked(&[&d], &[]);
        let e = s.check_network("broker:9092").unwrap_err().to_string();
        assert!(
            e.contains("enable_external_access") && e.contains("broker:9092"),
            "{e}"
        );
        s.check_checkpoint(&format!("{}/new/ck.sqlite", d.display()))
            .unwrap();
        let e = s
            .check_checkpoint(&format!("{}/../ck.sqlite", d.display()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("checkpoint"), "{e}");
    }
}
