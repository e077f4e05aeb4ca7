//! Opening the files a trace names (modules, their debug files): only regular files, and never
//! in a way that can wait. A path in a trace is whatever the traced process had mapped; a FIFO
//! or a device there must not hang the CLI (opening a FIFO waits for a writer).

use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Whether `path` is a regular file (following symbolic links); asking never blocks.
pub fn is_regular(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file())
}

/// Opens `path` for reading if it is a regular file: checked before (so a FIFO is never
/// opened) and after (the path may have been replaced in between; O_NONBLOCK keeps that open
/// from waiting).
pub fn open_regular(path: &Path) -> io::Result<File> {
    let not_regular = || io::Error::new(io::ErrorKind::InvalidInput, "not a regular file");
    if !is_regular(path) {
        return Err(std::fs::metadata(path).err().unwrap_or_else(not_regular));
    }
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)?;
    if !f.metadata()?.is_file() {
        return Err(not_regular());
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifos_and_devices_are_refused_without_waiting_and_regular_files_open() {
        let dir = std::env::temp_dir().join(format!("gmt-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo.so");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let link = dir.join("link.so");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        let file = dir.join("lib.so");
        std::fs::write(&file, b"\x7fELF").unwrap();
        for p in [&fifo, &link, Path::new("/dev/null"), dir.as_path()] {
            let e = open_regular(p).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{}", p.display());
        }
        assert_eq!(open_regular(&dir.join("missing.so")).unwrap_err().kind(), io::ErrorKind::NotFound);
        assert!(open_regular(&file).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
