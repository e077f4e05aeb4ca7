//! Where traces are read from: the one place that turns the command line's paths (files,
//! directories of `*.trace` files, `-` for standard input) into trace files and inputs.
//!
//! Loading replays a trace twice (see `model`), and a pipe can only be read once: a regular
//! file is opened once per pass, anything else (`-` for stdin, `/dev/stdin`, a FIFO, `<(...)`)
//! is read into memory once and replayed from there, so that every source gives the same
//! answer as the file it came from. [`stream`] reads a source once, as it comes (`dump`).

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use gpumemtrace_format::recover::Recovery;

use crate::error::Error;

pub enum Input {
    /// A regular file: read again for each pass. The journal beside it is read once, so every
    /// pass completes the trace alike (a live process's journal moves on meanwhile).
    File { path: PathBuf, len: u64, recovery: Option<Box<Recovery>> },
    /// A pipe or other stream, read to its end once.
    Memory { path: PathBuf, bytes: Vec<u8> },
}

/// The name that stands for standard input.
pub const STDIN: &str = "-";

impl Input {
    /// Opens `path` (`-`: standard input); streams are read to their end here.
    pub fn open(path: &Path) -> Result<Input, Error> {
        let err = |e: io::Error| format!("{}: {e}", display(path));
        if path.as_os_str() == STDIN {
            let mut bytes = Vec::new();
            io::stdin().lock().read_to_end(&mut bytes).map_err(err)?;
            return Ok(Input::Memory { path: path.to_path_buf(), bytes });
        }
        let meta = std::fs::metadata(path).map_err(err)?;
        if meta.is_file() {
            return Ok(Input::File { path: path.to_path_buf(), len: meta.len(), recovery: recovery_beside(path).map(Box::new) });
        }
        if meta.is_dir() {
            return Err(Error::new(format!("{}: is a directory", path.display())));
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

    /// The journal beside a trace file, which completes a trace its process did not finish
    /// (docs/format.md, "The journal"), for one pass; `None` for streams, or when there is none.
    /// A journal that cannot be read is reported once on stderr and left aside.
    pub fn recovery(&self) -> Option<Recovery> {
        match self {
            Input::File { recovery, .. } => recovery.as_deref().cloned(),
            Input::Memory { .. } => None,
        }
    }

    /// A reader from the start of the trace (once per pass).
    pub fn reader(&self) -> io::Result<Box<dyn Read + Send + '_>> {
        match self {
            Input::File { path, .. } => Ok(Box::new(File::open(path)?)),
            Input::Memory { bytes, .. } => Ok(Box::new(&bytes[..])),
        }
    }
}

/// The journal beside the trace file `path`, if any (see [`Input::recovery`]).
pub fn recovery_beside(path: &Path) -> Option<Recovery> {
    if path.as_os_str() == STDIN {
        return None;
    }
    match Recovery::beside(path) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gpumemtrace: {}: the journal beside it cannot be read ({e}); the trace is read without it", display(path));
            None
        }
    }
}

/// A reader of `path` (`-`: standard input) for a single pass: nothing is read ahead.
pub fn stream(path: &Path) -> io::Result<Box<dyn Read>> {
    if path.as_os_str() == STDIN {
        return Ok(Box::new(io::stdin().lock()));
    }
    let f = File::open(path).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", display(path))))?;
    Ok(Box::new(f))
}

/// The trace files named by the command line: files as given, directories expanded to
/// their `*.trace` files, sorted.
pub fn expand(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut found = trace_files(p).map_err(|e| format!("{}: {e}", p.display()))?;
            if found.is_empty() {
                return Err(format!("{}: no *.trace files in this directory", p.display()));
            }
            found.sort();
            out.extend(found);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// The `*.trace` files directly in `dir`, unsorted.
pub fn trace_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut v = Vec::new();
    for entry in dir.read_dir()? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "trace") && path.is_file() {
            v.push(path);
        }
    }
    Ok(v)
}

/// The process id in a trace file's name: `--pid` picks traces by it.
pub fn pid_of(path: &Path) -> Option<u32> {
    // gpumemtrace-<pid>.trace, gpumemtrace-<pid>.<n>.trace
    let stem = path.file_name()?.to_str()?.strip_suffix(".trace")?;
    let rest = stem.rsplit_once('-')?.1;
    rest.split('.').next()?.parse().ok()
}

/// The trace files of `paths` (files, or directories' *.trace), those of process `pid` only.
pub fn traces_of(paths: &[PathBuf], pid: Option<u32>) -> Result<Vec<PathBuf>, String> {
    let all = expand(paths)?;
    let Some(pid) = pid else { return Ok(all) };
    let v: Vec<PathBuf> = all.into_iter().filter(|p| pid_of(p) == Some(pid)).collect();
    if v.is_empty() {
        return Err(format!("no trace of pid {pid} (trace files are named gpumemtrace-<pid>.trace)"));
    }
    Ok(v)
}

/// The one trace of `path` (a file, or a directory holding one, or one of process `pid`).
pub fn one_trace(path: &Path, pid: Option<u32>) -> Result<PathBuf, Error> {
    let mut v = traces_of(&[path.to_path_buf()], pid)?;
    if v.len() > 1 {
        let pids: Vec<String> =
            v.iter().map(|p| pid_of(p).map_or_else(|| p.display().to_string(), |n| n.to_string())).collect();
        return Err(Error::new(format!("{} holds {} traces: pick one with --pid ({})", path.display(), v.len(), pids.join(", "))));
    }
    Ok(v.remove(0))
}

/// The one trace of `path` for a command without --pid (diff): several are an error naming them.
pub fn only_trace(path: &Path) -> Result<PathBuf, Error> {
    let mut v = traces_of(&[path.to_path_buf()], None)?;
    if v.len() > 1 {
        let names: Vec<String> = v.iter().map(|p| p.display().to_string()).collect();
        return Err(Error::new(format!("{} holds {} traces: name the one to compare ({})", path.display(), v.len(), names.join(", "))));
    }
    Ok(v.remove(0))
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
    fn pids_from_names() {
        assert_eq!(pid_of(Path::new("/x/gpumemtrace-1234.trace")), Some(1234));
        assert_eq!(pid_of(Path::new("gpumemtrace-77.2.trace")), Some(77));
        assert_eq!(pid_of(Path::new("other.trace")), None);
    }

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
