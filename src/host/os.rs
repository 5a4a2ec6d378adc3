//! Operating-system calls the standard library has no safe API for: a byte-range lock that
//! belongs to one open file description (so it conflicts within this process too), and an exit
//! handler, and giving the allocator's free pages back. The job lock of a checkpoint file is
//! built on the first.

use std::fs::File;
use std::os::fd::AsRawFd;

use streaming_etl_core::{EtlError, Result};
use streaming_etl_runtime::lock::JobLock;

/// Takes an exclusive lock on one byte of `file` (an open-file-description lock: it conflicts
/// with every other open of the file, in this process too, and goes away with the process).
/// Returns false when someone else holds it. Missing in `std`: `File::try_lock` locks the
/// whole file, and one lock file holds the locks of every job of a checkpoint.
fn try_lock_byte(file: &File, offset: i64) -> std::io::Result<bool> {
    // SAFETY: a zeroed flock is a valid value to fill in.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = offset as libc::off_t;
    fl.l_len = 1;
    // SAFETY: `file` is open for the duration of the call; `fl` is a valid flock.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

/// Takes the job's lock: a byte (chosen by hashing the job name) of `<checkpoint>.lock`.
pub fn lock_job_file(path: &str, job: &str) -> Result<JobLock> {
    let lock_path = format!("{path}.lock");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(|e| {
            EtlError::checkpoint(
                path,
                format!("cannot create its lock file '{lock_path}': {e}"),
            )
        })?;
    // FNV-1a of the job name picks the byte; a collision only makes two jobs wait for each
    // other, never run together.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in job.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    match try_lock_byte(&file, (h >> 2) as i64) {
        Ok(true) => Ok(JobLock::held(file)),
        Ok(false) => Err(EtlError::JobBusy {
            job: job.to_string(),
            path: path.to_string(),
        }),
        Err(e) => Err(EtlError::checkpoint(
            path,
            format!("cannot lock '{lock_path}': {e}"),
        )),
    }
}

/// Runs `f` once when the process exits, before the exit handlers of libraries loaded earlier
/// (DuckDB's own). Missing in `std`: `atexit`.
pub fn at_exit(f: extern "C" fn()) {
    // SAFETY: registering a plain function pointer has no preconditions.
    unsafe {
        libc::atexit(f);
    }
}

/// Gives the C allocator's free pages back to the system (glibc's `malloc_trim`; elsewhere
/// nothing). A scheduled job calls it between runs: each run's threads leave their freed
/// buffers in the allocator's arenas, which a process that runs for weeks would otherwise keep.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes the allocator's own locks; it only returns free pages.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_run_per_job_in_this_process_and_others() {
        let dir = std::env::temp_dir().join(format!("setl-os-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("jobs.ckpt").to_string_lossy().into_owned();
        let first = lock_job_file(&path, "a").unwrap();
        let e = lock_job_file(&path, "a").err().unwrap().to_string();
        assert!(e.contains("job 'a' is already running"), "{e}");
        let _b = lock_job_file(&path, "b").unwrap();
        drop(first);
        lock_job_file(&path, "a").unwrap();
        let e = lock_job_file("/no/such/dir/x.ckpt", "a").err().unwrap();
        assert!(
            e.to_string()
                .contains("cannot create its lock file '/no/such/dir/x.ckpt.lock'"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
