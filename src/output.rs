//! Where the trace goes, and creating it safely: never following a symlink planted in a shared
//! directory, never overwriting another process's trace (O_EXCL), private by default (0600).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The path the trace of process `pid` should get, from `GPUMEMTRACE_OUTPUT` (or the default
/// `gpumemtrace-<pid>.trace` in the working directory). Under a torchrun-style launcher (`RANK`
/// set) the default name is `gpumemtrace-rank<RANK>-<pid>.trace`, so ranks sort together and a
/// restarted rank (new pid) never collides. In a setting, `%p` is the pid and `%r` the rank
/// (`x` when there is none).
pub fn target(setting: Option<&str>, pid: u32, rank: Option<u32>) -> PathBuf {
    let default_name = match rank {
        Some(r) => format!("gpumemtrace-rank{r}-{pid}.trace"),
        None => format!("gpumemtrace-{pid}.trace"),
    };
    match setting {
        None => PathBuf::from(default_name),
        Some(s) => {
            let rank = rank.map_or_else(|| "x".to_string(), |r| r.to_string());
            let s = s.replace("%p", &pid.to_string()).replace("%r", &rank);
            if s.ends_with('/') || Path::new(&s).is_dir() {
                Path::new(&s).join(default_name)
            } else {
                PathBuf::from(s)
            }
        }
    }
}

/// Creates the trace file at `path`, or at `name.1.trace`, `name.2.trace`... if taken.
pub fn create(path: &Path, mode: u32) -> io::Result<(File, PathBuf)> {
    let mut candidate = path.to_path_buf();
    for n in 1..=1000u32 {
        match OpenOptions::new()
            .write(true)
            .create_new(true) // O_CREAT | O_EXCL: also refuses to follow a symlink at the path
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&candidate)
        {
            Ok(f) => return Ok((f, candidate)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => candidate = numbered(path, n),
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(io::ErrorKind::AlreadyExists, "1000 trace files with this name exist already"))
}

/// `dir/name.trace` -> `dir/name.N.trace`.
fn numbered(path: &Path, n: u32) -> PathBuf {
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    match path.extension() {
        Some(ext) => path.with_file_name(format!("{stem}.{n}.{}", ext.to_string_lossy())),
        None => path.with_file_name(format!("{stem}.{n}")),
    }
}

/// The device and inode of the open file `fd` (None if it is not open): what tells one of our
/// descriptors from a number the host has reused.
pub fn identity(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: fstat writes into the stat buffer we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// Runs `f` (a write or a resize of one of our files) with SIGXFSZ blocked: past RLIMIT_FSIZE
/// the kernel sends it, and its default action ends the process; blocked, the call fails with
/// EFBIG instead. The signal our call raised is consumed; one the host had pending is left.
pub fn without_sigxfsz<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: signal-mask calls on local sets; the previous mask is restored before returning.
    unsafe {
        let mut xfsz: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        let mut pending: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut xfsz);
        libc::sigaddset(&mut xfsz, libc::SIGXFSZ);
        libc::pthread_sigmask(libc::SIG_BLOCK, &xfsz, &mut old);
        libc::sigpending(&mut pending);
        let was_pending = libc::sigismember(&pending, libc::SIGXFSZ) == 1;
        let r = f();
        libc::sigpending(&mut pending);
        if !was_pending && libc::sigismember(&pending, libc::SIGXFSZ) == 1 {
            let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            libc::sigtimedwait(&xfsz, std::ptr::null_mut(), &zero);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_setting() {
        assert_eq!(target(None, 7, None), PathBuf::from("gpumemtrace-7.trace"));
        assert_eq!(target(Some("/tmp/"), 7, None), PathBuf::from("/tmp/gpumemtrace-7.trace"));
        assert_eq!(target(Some("/tmp"), 7, None), PathBuf::from("/tmp/gpumemtrace-7.trace"));
        assert_eq!(target(Some("/x/run-%p.trace"), 7, None), PathBuf::from("/x/run-7.trace"));
        assert_eq!(target(None, 7, Some(3)), PathBuf::from("gpumemtrace-rank3-7.trace"));
        assert_eq!(target(Some("/tmp/"), 7, Some(0)), PathBuf::from("/tmp/gpumemtrace-rank0-7.trace"));
        assert_eq!(target(Some("/x/r%r-%p.trace"), 7, Some(2)), PathBuf::from("/x/r2-7.trace"));
        assert_eq!(target(Some("/x/r%r.trace"), 7, None), PathBuf::from("/x/rx.trace"));
    }

    #[test]
    fn existing_files_and_symlinks_are_never_overwritten() {
        let dir = std::env::temp_dir().join(format!("gmt-output-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("t.trace");
        std::fs::write(&p, b"precious").unwrap();
        let victim = dir.join("victim");
        std::fs::write(&victim, b"victim").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("t.1.trace")).unwrap();
        let (_f, got) = create(&p, 0o600).unwrap();
        assert_eq!(got, dir.join("t.2.trace"));
        assert_eq!(std::fs::read(&p).unwrap(), b"precious");
        assert_eq!(std::fs::read(&victim).unwrap(), b"victim");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&got).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
