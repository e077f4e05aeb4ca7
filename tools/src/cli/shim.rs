//! Where `gpumemtrace run` finds the preload library, `libgpumemtrace.so`, in each way the
//! CLI is installed:
//! 1. `$GPUMEMTRACE_LIB`, when set;
//! 2. next to the executable (`target/release/` of a build, an unpacked tarball);
//! 3. `../lib/gpumemtrace/` from the executable's directory: the Python wheel's layout
//!    (`<venv>/bin/gpumemtrace`, `<venv>/lib/gpumemtrace/libgpumemtrace.so`), as a prefix
//!    install puts it;
//! 4. the copy carried inside the executable (`cargo install --path tools`; see build.rs),
//!    written once into a private cache directory under a name made from its content.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::error::Error;

/// The preload library's file name.
pub const LIB_NAME: &str = "libgpumemtrace.so";

/// The preload library carried inside this executable.
pub struct Embedded {
    /// `libgpumemtrace-<hash of the bytes>.so`.
    pub name: &'static str,
    pub bytes: &'static [u8],
}

#[cfg(gpumemtrace_embedded_shim)]
const EMBEDDED: Option<Embedded> = Some(Embedded {
    name: env!("GPUMEMTRACE_EMBEDDED_SHIM_NAME"),
    bytes: include_bytes!(concat!(env!("OUT_DIR"), "/libgpumemtrace.so")),
});
#[cfg(not(gpumemtrace_embedded_shim))]
const EMBEDDED: Option<Embedded> = None;

/// The preload library for this process: see the module's documentation for the order.
pub fn find() -> Result<PathBuf, Error> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate this executable: {e}"))?;
    let env = std::env::var_os("GPUMEMTRACE_LIB");
    Ok(find_from(env.as_deref(), &exe, EMBEDDED.as_ref(), &cache_dirs())?)
}

/// The places installs put the library, relative to the executable, in the order looked at.
pub fn installed_places(exe: &Path) -> Vec<PathBuf> {
    let dir = exe.parent().unwrap_or(Path::new("/"));
    vec![
        dir.join(LIB_NAME),
        dir.join("../lib/gpumemtrace").join(LIB_NAME),
    ]
}

fn find_from(
    env_lib: Option<&OsStr>,
    exe: &Path,
    embedded: Option<&Embedded>,
    cache_dirs: &[PathBuf],
) -> Result<PathBuf, String> {
    if let Some(p) = env_lib.filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return match p.exists() {
            true => Ok(p),
            false => Err(format!(
                "GPUMEMTRACE_LIB names {}, which does not exist",
                p.display()
            )),
        };
    }
    let places = installed_places(exe);
    if let Some(p) = places.iter().find(|p| p.is_file()) {
        return Ok(p.clone());
    }
    let looked = places
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(" and ");
    let Some(embedded) = embedded else {
        return Err(format!(
            "the preload library {LIB_NAME} was not found (looked for {looked}); install it \
             there or set GPUMEMTRACE_LIB to its path"
        ));
    };
    let mut errors = Vec::new();
    for dir in cache_dirs {
        match extract(dir, embedded) {
            Ok(p) => return Ok(p),
            Err(e) => errors.push(e),
        }
    }
    Err(format!(
        "the preload library {LIB_NAME} was not found (looked for {looked}), and the copy \
         inside this executable could not be written out: {}; set GPUMEMTRACE_LIB to a copy \
         of it, or XDG_CACHE_HOME to a directory of yours",
        errors.join("; ")
    ))
}

/// Private directories for the embedded copy: `$XDG_CACHE_HOME/gpumemtrace` (else
/// `~/.cache/gpumemtrace`), then `gpumemtrace-<uid>` in the temporary directory.
fn cache_dirs() -> Vec<PathBuf> {
    let abs = |v: Option<OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    let mut v = Vec::new();
    if let Some(base) = abs(std::env::var_os("XDG_CACHE_HOME"))
        .or_else(|| abs(std::env::var_os("HOME")).map(|h| h.join(".cache")))
    {
        v.push(base.join("gpumemtrace"));
    }
    // SAFETY: no preconditions.
    let uid = unsafe { libc::geteuid() };
    v.push(std::env::temp_dir().join(format!("gpumemtrace-{uid}")));
    v
}

/// Writes `e` into `dir` as `dir/e.name`, unless an equal copy is there, and returns its path.
/// The directory is created 0700 and must be a real directory (not a symbolic link), ours, and
/// writable by no one else; the file is opened without following links, compared byte for
/// byte before it is used, and replaced atomically (a temporary file renamed over it).
fn extract(dir: &Path, e: &Embedded) -> Result<PathBuf, String> {
    let fail = |what: &str, err: std::io::Error| format!("{what} {}: {err}", dir.display());
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|err| fail("cannot create", err))?;
    let dfd = open_at(
        None,
        dir.as_os_str(),
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )
    .map_err(|err| fail("cannot open (a symbolic link is refused)", err))?;
    let st = fstat(&dfd).map_err(|err| fail("cannot stat", err))?;
    // SAFETY: no preconditions.
    let uid = unsafe { libc::geteuid() };
    if st.st_uid != uid || st.st_mode & 0o022 != 0 {
        return Err(format!(
            "{} is not a private directory (owner uid {}, mode {:o}; wanted uid {uid}, \
             writable by its owner only)",
            dir.display(),
            st.st_uid,
            st.st_mode & 0o7777
        ));
    }
    let path = dir.join(e.name);
    let name = OsStr::new(e.name);
    if let Ok(fd) = open_at(Some(&dfd), name, libc::O_RDONLY | libc::O_NOFOLLOW, 0) {
        if is_copy_of(fd, uid, e.bytes) {
            return Ok(path);
        }
    }
    let tmp = OsString::from(format!(".{}.{}.tmp", e.name, std::process::id()));
    let c_tmp = cstr(&tmp)?;
    // SAFETY: valid fd and string. A leftover of a dead process with this pid goes first.
    unsafe { libc::unlinkat(dfd.as_raw_fd(), c_tmp.as_ptr(), 0) };
    let fd = open_at(
        Some(&dfd),
        &tmp,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        0o600,
    )
    .map_err(|err| fail("cannot create a file in", err))?;
    let written = File::from(fd).write_all(e.bytes).and_then(|()| {
        let c_name = cstr(name).map_err(std::io::Error::other)?;
        // SAFETY: valid fd and strings.
        match unsafe {
            libc::renameat(
                dfd.as_raw_fd(),
                c_tmp.as_ptr(),
                dfd.as_raw_fd(),
                c_name.as_ptr(),
            )
        } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    });
    if let Err(err) = written {
        // SAFETY: valid fd and string.
        unsafe { libc::unlinkat(dfd.as_raw_fd(), c_tmp.as_ptr(), 0) };
        return Err(fail("cannot write the preload library into", err));
    }
    Ok(path)
}

/// A regular file of ours holding exactly `bytes`.
fn is_copy_of(fd: OwnedFd, uid: libc::uid_t, bytes: &[u8]) -> bool {
    let Ok(st) = fstat(&fd) else { return false };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG
        || st.st_uid != uid
        || st.st_size as u64 != bytes.len() as u64
    {
        return false;
    }
    let mut have = Vec::with_capacity(bytes.len());
    File::from(fd).read_to_end(&mut have).is_ok() && have == bytes
}

fn cstr(s: &OsStr) -> Result<CString, String> {
    CString::new(s.as_bytes()).map_err(|_| format!("{} holds a NUL byte", s.to_string_lossy()))
}

/// `openat(dir or AT_FDCWD, path, flags | O_CLOEXEC, mode)`.
fn open_at(
    dir: Option<&OwnedFd>,
    path: &OsStr,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> std::io::Result<OwnedFd> {
    let c = cstr(path).map_err(std::io::Error::other)?;
    let dfd = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: valid string; the fd returned is owned by nobody else.
    let fd = unsafe { libc::openat(dfd, c.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fstat(fd: &OwnedFd) -> std::io::Result<libc::stat> {
    // SAFETY: a zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out-pointer.
    match unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } {
        0 => Ok(st),
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn scratch(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("gpumemtrace-shim-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    const FAKE: Embedded = Embedded {
        name: "libgpumemtrace-0123abcd.so",
        bytes: b"\x7fELF not really a library",
    };

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"lib").unwrap();
    }

    #[test]
    fn finds_the_library_where_each_install_puts_it() {
        let root = scratch("places");
        let exe = root.join("venv/bin/gpumemtrace");
        std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
        let none: &[PathBuf] = &[];
        // Nothing anywhere, nothing embedded: the message names both places.
        let e = find_from(None, &exe, None, none).unwrap_err();
        assert!(
            e.contains(&format!("{}/venv/bin/libgpumemtrace.so", root.display()))
                && e.contains("venv/bin/../lib/gpumemtrace/libgpumemtrace.so")
                && e.contains("GPUMEMTRACE_LIB"),
            "{e}"
        );
        // The wheel's layout: <venv>/lib/gpumemtrace/.
        let wheel = root.join("venv/lib/gpumemtrace/libgpumemtrace.so");
        touch(&wheel);
        let found = find_from(None, &exe, Some(&FAKE), none).unwrap();
        assert_eq!(found.canonicalize().unwrap(), wheel);
        // Next to the executable comes first (a build's target/release/).
        let beside = root.join("venv/bin/libgpumemtrace.so");
        touch(&beside);
        assert_eq!(find_from(None, &exe, None, none).unwrap(), beside);
        // GPUMEMTRACE_LIB before all (an empty one counts as unset).
        let other = root.join("other.so");
        touch(&other);
        assert_eq!(
            find_from(Some(other.as_os_str()), &exe, None, none).unwrap(),
            other
        );
        assert_eq!(
            find_from(Some(OsStr::new("")), &exe, None, none).unwrap(),
            beside
        );
        let e = find_from(Some(OsStr::new("/nonexistent/x.so")), &exe, None, none).unwrap_err();
        assert!(e.contains("GPUMEMTRACE_LIB names /nonexistent/x.so"), "{e}");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn the_embedded_copy_is_written_once_into_a_private_directory() {
        let root = scratch("extract");
        let exe = root.join("bin/gpumemtrace");
        // The first cache directory cannot be made (a file is in the way): the next one is used.
        std::fs::write(root.join("file"), b"").unwrap();
        let dirs = [
            root.join("file/gpumemtrace"),
            root.join("cache/gpumemtrace"),
        ];
        let p = find_from(None, &exe, Some(&FAKE), &dirs).unwrap();
        assert_eq!(p, dirs[1].join(FAKE.name));
        assert_eq!(std::fs::read(&p).unwrap(), FAKE.bytes);
        let dir_mode = std::fs::metadata(&dirs[1]).unwrap().permissions().mode();
        assert_eq!(dir_mode & 0o777, 0o700);
        // Again: the same file, not rewritten.
        let ino = std::fs::metadata(&p).unwrap().ino();
        assert_eq!(extract(&dirs[1], &FAKE).unwrap(), p);
        assert_eq!(std::fs::metadata(&p).unwrap().ino(), ino);
        // A changed copy is replaced.
        std::fs::write(&p, b"tampered").unwrap();
        extract(&dirs[1], &FAKE).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), FAKE.bytes);
        assert!(
            std::fs::read_dir(&dirs[1]).unwrap().count() == 1,
            "no temporary file left"
        );
        // A symbolic link as the file is not followed: replaced by a file.
        let target = root.join("elsewhere.so");
        std::fs::write(&target, FAKE.bytes).unwrap();
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink(&target, &p).unwrap();
        extract(&dirs[1], &FAKE).unwrap();
        assert!(!std::fs::symlink_metadata(&p)
            .unwrap()
            .file_type()
            .is_symlink());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn the_wheel_puts_the_library_where_it_is_looked_for() {
        // pyproject.toml names the wheel's data directory with the version: keep it Cargo's.
        let pyproject = Path::new(env!("CARGO_MANIFEST_DIR")).join("../pyproject.toml");
        let text = std::fs::read_to_string(&pyproject).unwrap();
        let to = format!(
            "to = \"gpumemtrace-{}.data/data/lib/gpumemtrace\"",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&to), "{} lacks {to}", pyproject.display());
        // <prefix>/bin/gpumemtrace looks in <prefix>/lib/gpumemtrace/.
        let places = installed_places(Path::new("/p/bin/gpumemtrace"));
        assert_eq!(
            places[1],
            Path::new("/p/bin/../lib/gpumemtrace/libgpumemtrace.so")
        );
    }

    #[test]
    fn refuses_directories_that_are_not_private() {
        let root = scratch("refuse");
        // A symbolic link to a directory.
        let real = root.join("real");
        std::fs::create_dir(&real).unwrap();
        let link = root.join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = extract(&link, &FAKE).unwrap_err();
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_dir(&real).unwrap().count(), 0);
        // Writable by others.
        let open = root.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = extract(&open, &FAKE).unwrap_err();
        assert!(e.contains("not a private directory"), "{e}");
        let _ = std::fs::remove_dir_all(&root);
    }
}
