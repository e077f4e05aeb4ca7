//! Where the trace goes, and creating it safely: never following a symlink planted in a shared
//! directory, never overwriting another process's trace (O_EXCL), private by default (0600).
//! A target that exists and is not a regular file (`/dev/null`, a FIFO, a Unix socket) is
//! written to as it is, non-blocking: no write waits for it longer than `PATIENCE`.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

/// How long a write waits for an output that takes nothing (a FIFO or socket nobody reads), and
/// how long the start waits for a FIFO's reader: then the output is given up.
pub const PATIENCE: Duration = Duration::from_secs(1);

/// How long the exit may spend writing what is left to an output that drains, but slowly (a
/// FIFO read a little at a time): a host's exit is not held for longer.
pub const AT_EXIT: Duration = Duration::from_secs(10);

/// When writes give up however much the output still takes (ns of `CLOCK_MONOTONIC`; 0: never).
static GIVE_UP_AT_NS: AtomicU64 = AtomicU64::new(0);

/// From now on, writes stop once `AT_EXIT` has passed (the process is ending).
pub fn exiting() {
    let _ = GIVE_UP_AT_NS.compare_exchange(0, now_ns() + AT_EXIT.as_nanos() as u64, Ordering::SeqCst, Ordering::SeqCst);
}

/// Whether `exiting` was called.
pub fn is_exiting() -> bool {
    GIVE_UP_AT_NS.load(Ordering::SeqCst) != 0
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// When the write in progress began (ns of `CLOCK_MONOTONIC`; 0: none in progress), and the
/// time all finished writes took. The writer changes them at every write: their own cache lines,
/// apart from what hooks read.
struct Writes {
    since_ns: AtomicU64,
    total_ns: AtomicU64,
}
static WRITES: CachePadded<Writes> = CachePadded::new(Writes { since_ns: AtomicU64::new(0), total_ns: AtomicU64::new(0) });

/// Time spent writing to the output so far, the write in progress included: a writer that
/// spends most of its time there is held by its output (a slow disk, a pipe read slowly),
/// not merely short of CPU.
pub fn time_in_writes() -> Duration {
    let done = WRITES.total_ns.load(Ordering::Relaxed);
    let now = match WRITES.since_ns.load(Ordering::Relaxed) {
        0 => 0,
        since => now_ns().saturating_sub(since),
    };
    Duration::from_nanos(done + now)
}

fn past_exit_deadline() -> bool {
    let at = GIVE_UP_AT_NS.load(Ordering::Relaxed);
    at != 0 && now_ns() >= at
}

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

/// Creates the trace file at `path`, or at `name.1.trace`, `name.2.trace`... if taken. A
/// character device, FIFO or socket at `path` itself (see `open_special`) is the target instead.
pub fn create(path: &Path, mode: u32) -> io::Result<(File, PathBuf)> {
    if let Some(f) = open_special(path)? {
        return Ok((f, path.to_path_buf()));
    }
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

/// The target is not a regular file: no journal beside it (that could be in /dev), and writes
/// may meet a full pipe.
pub fn is_special(f: &File) -> bool {
    f.metadata().map(|m| !m.file_type().is_file()).unwrap_or(true)
}

/// An existing non-regular file at `path` (not through a symbolic link), opened for writing
/// without blocking: a character device (`/dev/null`), or a FIFO or Unix socket of our own user
/// (one planted by someone else in a shared directory is passed over like an existing file).
/// `None`: nothing special there, the trace is a regular file.
fn open_special(path: &Path) -> io::Result<Option<File>> {
    let Ok(md) = std::fs::symlink_metadata(path) else { return Ok(None) };
    let ft = md.file_type();
    // SAFETY: geteuid has no preconditions.
    let ours = md.uid() == unsafe { libc::geteuid() };
    let open = |path: &Path| {
        OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
    };
    if ft.is_char_device() {
        open(path).map(Some)
    } else if ft.is_fifo() && ours {
        // Opening a FIFO without a reader fails (ENXIO) rather than waiting: wait, bounded.
        let t0 = Instant::now();
        loop {
            match open(path) {
                Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                    if t0.elapsed() >= PATIENCE {
                        return Err(io::Error::other(format!(
                            "it is a FIFO that no process opened for reading within {} s",
                            PATIENCE.as_secs()
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(e),
                Ok(f) => return own_fifo(f).map(Some),
            }
        }
    } else if ft.is_socket() && ours {
        connect(path).map(Some)
    } else {
        Ok(None)
    }
}

/// One process's trace at a time in a FIFO: two writing at once (a forked child, a spawned
/// worker) would interleave their records into one unreadable stream. The lock lives as long as
/// the writer's open file; a process that cannot take it does not trace.
fn own_fifo(f: File) -> io::Result<File> {
    // SAFETY: flock on the descriptor we just opened.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(f);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Err(io::Error::other("another process is writing its trace into this FIFO"));
    }
    Ok(f) // a file system without locks: nothing to enforce it with
}

/// A non-blocking connection to the Unix stream socket at `path`; a full backlog (a listener
/// that never accepts) is retried for at most `PATIENCE`.
fn connect(path: &Path) -> io::Result<File> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: a zeroed sockaddr_un is valid; the path is copied within its bounds (checked).
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::other("the socket's path is too long"));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, &b) in addr.sun_path.iter_mut().zip(bytes) {
        *d = b as libc::c_char;
    }
    // SAFETY: a new socket; on success its descriptor is ours and owned by the File.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is the socket just made, owned from here on (closed on drop).
    let sock = unsafe { File::from_raw_fd(fd) };
    let t0 = Instant::now();
    loop {
        // SAFETY: connect with an address we own and its true size.
        let r = unsafe {
            libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t)
        };
        let e = io::Error::last_os_error();
        match (r, e.raw_os_error()) {
            (0, _) => return Ok(sock),
            (_, Some(libc::EINTR)) => {}
            (_, Some(libc::EAGAIN)) if t0.elapsed() < PATIENCE => std::thread::sleep(Duration::from_millis(10)),
            _ => return Err(e),
        }
    }
}

/// Opens the trace again by its path (see `Writer::own_descriptor`): appending, no symbolic link
/// followed, never blocking (a FIFO's reader may be gone; a socket cannot be reopened).
pub fn reopen(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new().append(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK).open(path)?;
    if f.metadata()?.file_type().is_fifo() {
        return own_fifo(f);
    }
    Ok(f)
}

/// Writes all of `buf`, never killing the host (SIGXFSZ and SIGPIPE blocked: EFBIG and EPIPE
/// instead) and never waiting longer than `PATIENCE` for an output that takes nothing more.
pub fn write_all(file: &File, buf: &[u8]) -> io::Result<()> {
    let t0 = now_ns();
    WRITES.since_ns.store(t0, Ordering::Relaxed);
    let r = write_all_unwatched(file, buf);
    WRITES.total_ns.fetch_add(now_ns().saturating_sub(t0), Ordering::Relaxed);
    WRITES.since_ns.store(0, Ordering::Relaxed);
    r
}

fn write_all_unwatched(file: &File, buf: &[u8]) -> io::Result<()> {
    without_signals(&[libc::SIGXFSZ, libc::SIGPIPE], || {
        let mut rest = buf;
        let mut stuck_since: Option<Instant> = None;
        while !rest.is_empty() {
            match (&*file).write(rest) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    rest = &rest[n..];
                    stuck_since = None;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && past_exit_deadline() => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the output was still taking the trace {} s after the program ended", AT_EXIT.as_secs()),
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let waited = stuck_since.get_or_insert_with(Instant::now).elapsed();
                    let Some(left) = PATIENCE.checked_sub(waited).filter(|d| !d.is_zero()) else {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("the output took nothing for {} s (a FIFO or socket that nobody reads?)", PATIENCE.as_secs()),
                        ));
                    };
                    let mut p = libc::pollfd { fd: file.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
                    // SAFETY: poll on one pollfd we own, with a bounded timeout.
                    unsafe { libc::poll(&mut p, 1, left.as_millis().clamp(1, 100) as libc::c_int) };
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    })
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
/// EFBIG instead.
pub fn without_sigxfsz<R>(f: impl FnOnce() -> R) -> R {
    without_signals(&[libc::SIGXFSZ], f)
}

/// Runs `f` with `signals` blocked (SIGXFSZ past RLIMIT_FSIZE, SIGPIPE from a FIFO or socket
/// whose reader left: both end the process by default). A signal our call raised is consumed;
/// one the host had pending is left.
fn without_signals<R>(signals: &[libc::c_int], f: impl FnOnce() -> R) -> R {
    // SAFETY: signal-mask calls on local sets; the previous mask is restored before returning.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        let mut pending: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        libc::sigpending(&mut pending);
        // One bit a signal number (no allocation: this may run where a malloc wrapper reaches).
        let was_pending = signals.iter().filter(|&&s| libc::sigismember(&pending, s) == 1).fold(0u64, |m, &s| m | 1 << s);
        let r = f();
        libc::sigpending(&mut pending);
        for &s in signals {
            if was_pending & (1 << s) == 0 && libc::sigismember(&pending, s) == 1 {
                let mut one: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut one);
                libc::sigaddset(&mut one, s);
                let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
                libc::sigtimedwait(&one, std::ptr::null_mut(), &zero);
            }
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
