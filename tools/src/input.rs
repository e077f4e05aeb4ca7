//! Where a trace is read from. Loading replays a trace twice (see `model`), and a pipe can only
//! be read once: a regular file is opened once per pass, anything else (`-` for stdin,
//! `/dev/stdin`, a FIFO, `<(...)`) is read into memory once and replayed from there, so that
//! every source gives the same answer as the file it came from.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

pub enum Input {
    /// A regular file: read again for each pass.
    File { path: PathBuf, len: u64 },
    /// A pipe or other stream, read to its end once.
    Memory { path: PathBuf, bytes: Vec<u8> },
}

/// The name that stands for standard input.
pub const STDIN: &str = "-";

impl Input {
    /// Opens `path` (`-`: standard input); streams are read to their end here.
    pub fn open(path: &Path) -> Result<Input, String> {
        let err = |e: io::Error| format!("{}: {e}", display(path));
        if path.as_os_str() == STDIN {
            let mut bytes = Vec::new();
            io::stdin().lock().read_to_end(&mut bytes).map_err(err)?;
            return Ok(Input::Memory { path: path.to_path_buf(), bytes });
        }
        let meta = std::fs::metadata(path).map_err(err)?;
        if meta.is_file() {
            return Ok(Input::File { path: path.to_path_buf(), len: meta.len() });
        }
        if meta.is_dir() {
            return Err(format!("{}: is a directory", path.display()));
        }
        let mut bytes = Vec::new();
        File::open(path).and_then(|mut f| f.read_to_end(&mut bytes)).map_err(err)?;
        Ok(Input::Memory { path: path.to_path_buf(), bytes })
    }

    pub fn path(&self) -> &Path {
        match self {
            Input::File { path, .. } | Input::Memory { path, .. } => path,
        }
    }

    /// Bytes in the trace.
    pub fn len(&self) -> u64 {
        match self {
            Input::File { len, .. } => *len,
            Input::Memory { bytes, .. } => bytes.len() as u64,
        }
    }

    /// A reader from the start of the trace (once per pass).
    pub fn reader(&self) -> io::Result<Box<dyn Read + '_>> {
        match self {
            Input::File { path, .. } => Ok(Box::new(File::open(path)?)),
            Input::Memory { bytes, .. } => Ok(Box::new(&bytes[..])),
        }
    }
}

/// `path` for messages: `-` is standard input.
pub fn display(path: &Path) -> String {
    if path.as_os_str() == STDIN {
        "stdin".to_string()
    } else {
        path.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_read_once_and_replayed_from_memory() {
        let dir = std::env::temp_dir().join(format!("gpumemtrace-input-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("t.fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let writer = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::write(&fifo, b"0123456789").unwrap())
        };
        let input = Input::open(&fifo).unwrap();
        writer.join().unwrap();
        assert!(matches!(input, Input::Memory { .. }));
        for _ in 0..2 {
            let mut s = String::new();
            input.reader().unwrap().read_to_string(&mut s).unwrap();
            assert_eq!(s, "0123456789");
        }
        assert_eq!(input.len(), 10);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
