//! Human-readable sizes, times and CUDA result codes; names from a trace made safe to print.

use std::borrow::Cow;
use std::io::{self, Write};

/// The sum of byte counts, saturating: only a corrupt trace's sizes pass 2^64, and a report of
/// one must still come out (debug builds check every add).
pub fn total(bytes: impl IntoIterator<Item = u64>) -> u64 {
    bytes.into_iter().fold(0, u64::saturating_add)
}

/// `512 B`, `1.5 KiB`, `210.0 MiB`, `2.0 GiB`: binary units, one decimal.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// Where memory of a trace's `device` lies: `device 0`, or `host memory` (device -1).
pub fn place(device: i32) -> String {
    if device < 0 {
        "host memory".to_string()
    } else {
        format!("device {device}")
    }
}

/// A memory group's name in text reports: `device 0, device memory`, `device 0, blocks (tensors
/// of the caching allocator)`, `host memory (pinned)`, `vmm-reserved address space`. Device -1
/// in a trace is host memory; address reservations (device -1 too) are address space, no memory.
pub fn group_label(device: i32, kind: gpumemtrace_format::MemKind) -> String {
    use gpumemtrace_format::MemKind;
    match kind {
        MemKind::HostPinned => "host memory (pinned)".to_string(),
        MemKind::VmmReserved => "vmm-reserved address space".to_string(),
        MemKind::Block if device >= 0 => format!("device {device}, blocks (tensors of the caching allocator)"),
        k if device >= 0 => format!("device {device}, {} memory", k.name()),
        // GPU memory whose device the tracer could not tell.
        k => format!("unknown device, {} memory", k.name()),
    }
}

/// `1 allocation`, `2 allocations`.
pub fn count(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Trace time (nanoseconds since tracing started) as seconds.
pub fn seconds(ns: u64) -> String {
    format!("{:.3} s", ns as f64 / 1e9)
}

/// Names of common CUDA result codes. The runtime (`cudaError_t`) and driver (`CUresult`)
/// APIs agree on these numbers, so one table serves both.
pub fn cuda_result_name(code: u32) -> Option<&'static str> {
    Some(match code {
        0 => "success",
        1 => "invalid value",
        2 => "out of memory",
        3 => "not initialized",
        4 => "deinitialized",
        100 => "no device",
        101 => "invalid device",
        201 => "invalid context",
        400 => "invalid handle",
        500 => "not found",
        700 => "illegal address",
        800 => "not permitted",
        801 => "not supported",
        999 => "unknown",
        _ => return None,
    })
}

/// Common result codes by number: the driver's (`CUresult`) and the runtime's (`cudaError_t`)
/// names. The two APIs agree on these numbers.
const ERROR_NAMES: &[(u32, &str, &str)] = &[
    (1, "CUDA_ERROR_INVALID_VALUE", "cudaErrorInvalidValue"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY", "cudaErrorMemoryAllocation"),
    (3, "CUDA_ERROR_NOT_INITIALIZED", "cudaErrorInitializationError"),
    (4, "CUDA_ERROR_DEINITIALIZED", "cudaErrorCudartUnloading"),
    (34, "CUDA_ERROR_STUB_LIBRARY", "cudaErrorStubLibrary"),
    (46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "cudaErrorDevicesUnavailable"),
    (100, "CUDA_ERROR_NO_DEVICE", "cudaErrorNoDevice"),
    (101, "CUDA_ERROR_INVALID_DEVICE", "cudaErrorInvalidDevice"),
    (201, "CUDA_ERROR_INVALID_CONTEXT", "cudaErrorDeviceUninitialized"),
    (400, "CUDA_ERROR_INVALID_HANDLE", "cudaErrorInvalidResourceHandle"),
    (500, "CUDA_ERROR_NOT_FOUND", "cudaErrorSymbolNotFound"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS", "cudaErrorIllegalAddress"),
    (709, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "cudaErrorContextIsDestroyed"),
    (719, "CUDA_ERROR_LAUNCH_FAILED", "cudaErrorLaunchFailure"),
    (800, "CUDA_ERROR_NOT_PERMITTED", "cudaErrorNotPermitted"),
    (801, "CUDA_ERROR_NOT_SUPPORTED", "cudaErrorNotSupported"),
    (803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "cudaErrorSystemDriverMismatch"),
    (999, "CUDA_ERROR_UNKNOWN", "cudaErrorUnknown"),
];

/// The symbolic name of `code` as `api` returned it: `CUDA_ERROR_OUT_OF_MEMORY` from the driver
/// (`cu*`), `cudaErrorMemoryAllocation` from the runtime (`cuda*`); none for other APIs.
pub fn cuda_error_name(api: &str, code: u32) -> Option<&'static str> {
    let runtime = api.starts_with("cuda");
    if !runtime && !api.starts_with("cu") {
        return None;
    }
    let &(_, driver, rt) = ERROR_NAMES.iter().find(|e| e.0 == code)?;
    Some(if runtime { rt } else { driver })
}

/// `CUDA_ERROR_NOT_PERMITTED`, or `error 12345` when it has no name.
pub fn error_label(api: &str, code: u32) -> String {
    cuda_error_name(api, code).map_or_else(|| format!("error {code}"), str::to_string)
}

/// What a failed allocation call means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Failed {
    /// Out of memory (the driver's and the runtime's code 2): the failure that matters.
    OutOfMemory,
    /// A question, not a failure: `cuMemCreate` answering not permitted / not supported is
    /// PyTorch (and others) asking whether the device supports a kind of handle (fabric, IPC).
    Probe,
    /// Any other error (an invalid argument, a dead context...).
    Other,
}

pub fn classify(api: &str, code: u32) -> Failed {
    match (api, code) {
        (_, 2) => Failed::OutOfMemory,
        ("cuMemCreate", 800 | 801) => Failed::Probe,
        _ => Failed::Other,
    }
}

impl Failed {
    /// For JSON: `out-of-memory`, `capability-probe`, `other`.
    pub fn name(self) -> &'static str {
        match self {
            Failed::OutOfMemory => "out-of-memory",
            Failed::Probe => "capability-probe",
            Failed::Other => "other",
        }
    }
}

/// `error 2 (out of memory)`, or `error 12345` for codes without a name.
pub fn cuda_result(code: u32) -> String {
    match cuda_result_name(code) {
        Some(name) => format!("error {code} ({name})"),
        None => format!("error {code}"),
    }
}

/// `s` with every control character (C0, DEL, C1: terminal escapes, `\r`, newlines) written
/// as `\xHH`: a name from a trace (program, path, symbol, Python file) printed on one line can
/// neither drive the terminal nor forge or overwrite a line.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            out.push_str(&format!("\\x{:02x}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A text report's output: control characters (those of `printable`, but newline and tab,
/// which the report's own lines use) written as `\xHH`. The reports write nothing else of the
/// kind themselves, so only what came from a trace is changed. JSON goes through unchanged: it
/// escapes C0 itself, and an escape of ours in a string (for C1) would make it invalid.
pub struct Printable<W: Write> {
    inner: W,
    json: bool,
    /// A 0xC2 at the end of the last write: the first byte of a C1 control, or of a harmless
    /// character, depending on the next byte.
    held: bool,
}

impl<W: Write> Printable<W> {
    pub fn new(inner: W) -> Printable<W> {
        Printable { inner, json: false, held: false }
    }

    /// Escapes only when the output is not `json`.
    pub fn unless_json(json: bool, inner: W) -> Printable<W> {
        Printable { inner, json, held: false }
    }
}

/// The second byte of a C1 control in UTF-8 (U+0080..U+009F are 0xC2 0x80..0x9F).
fn c1(b: u8) -> bool {
    (0x80..0xa0).contains(&b)
}

impl<W: Write> Write for Printable<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.json {
            return self.inner.write(buf);
        }
        let (mut i, mut clean) = (0, 0);
        if std::mem::take(&mut self.held) && !buf.is_empty() {
            if c1(buf[0]) {
                write!(self.inner, "\\x{:02x}", buf[0])?;
                (i, clean) = (1, 1);
            } else {
                self.inner.write_all(&[0xc2])?;
            }
        }
        while i < buf.len() {
            let b = buf[i];
            let lead = b == 0xc2;
            let control = (b < 0x20 && b != b'\n' && b != b'\t') || b == 0x7f || (lead && buf.get(i + 1).is_some_and(|&n| c1(n)));
            // A lead byte at the end of the buffer: its meaning comes with the next write.
            let hold = lead && !control && i + 1 == buf.len();
            if !(control || hold) {
                i += 1;
                continue;
            }
            self.inner.write_all(&buf[clean..i])?;
            if hold {
                self.held = true;
                i += 1;
            } else if lead {
                write!(self.inner, "\\x{:02x}", buf[i + 1])?;
                i += 2;
            } else {
                write!(self.inner, "\\x{b:02x}")?;
                i += 1;
            }
            clean = i;
        }
        self.inner.write_all(&buf[clean..])?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if std::mem::take(&mut self.held) {
            self.inner.write_all(&[0xc2])?;
        }
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_from_names_are_escaped_and_the_rest_kept() {
        assert_eq!(printable("libfoo.so"), "libfoo.so");
        assert!(matches!(printable("grüße ✓"), Cow::Borrowed(_)));
        assert_eq!(printable("a\x1b]0;title\x07b\rc\u{9b}2Jd\ne\x7f"), "a\\x1b]0;title\\x07b\\x0dc\\x9b2Jd\\x0ae\\x7f");
        // The writer keeps newlines and tabs, and finds a C1 control split over two writes.
        let mut w = Printable::new(Vec::new());
        let pieces: [&[u8]; 5] = [b"x\t\x1b[2Jy\n", "é\u{a0}\r".as_bytes(), b"z\xc2", b"\x9bq\xc2", b"\xa0"];
        for piece in pieces {
            w.write_all(piece).unwrap();
        }
        w.flush().unwrap();
        assert_eq!(String::from_utf8(w.inner).unwrap(), "x\t\\x1b[2Jy\né\u{a0}\\x0dz\\x9bq\u{a0}");
    }

    #[test]
    fn sizes() {
        assert_eq!(size(0), "0 B");
        assert_eq!(size(1023), "1023 B");
        assert_eq!(size(1024), "1.0 KiB");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(210 << 20), "210.0 MiB");
        assert_eq!(size(2 << 30), "2.0 GiB");
        assert_eq!(size(3 << 40), "3.0 TiB");
    }

    #[test]
    fn times_and_results() {
        assert_eq!(seconds(512_000_000), "0.512 s");
        assert_eq!(
            (count(1u64, "free"), count(0u64, "free")),
            ("1 free".into(), "0 frees".into())
        );
        assert_eq!(seconds(0), "0.000 s");
        assert_eq!(cuda_result(2), "error 2 (out of memory)");
        assert_eq!(cuda_result(12345), "error 12345");
    }

    #[test]
    fn host_memory_has_one_name() {
        use gpumemtrace_format::MemKind;
        assert_eq!(place(-1), "host memory");
        assert_eq!(place(3), "device 3");
        assert_eq!(group_label(-1, MemKind::HostPinned), "host memory (pinned)");
        assert_eq!(group_label(-1, MemKind::VmmReserved), "vmm-reserved address space");
        assert_eq!(group_label(0, MemKind::Device), "device 0, device memory");
        assert_eq!(group_label(1, MemKind::Block), "device 1, blocks (tensors of the caching allocator)");
    }

    #[test]
    fn error_names_follow_the_api_and_probes_are_not_out_of_memory() {
        assert_eq!(cuda_error_name("cuMemCreate", 800), Some("CUDA_ERROR_NOT_PERMITTED"));
        assert_eq!(cuda_error_name("cuMemAlloc_v2", 2), Some("CUDA_ERROR_OUT_OF_MEMORY"));
        assert_eq!(cuda_error_name("cudaMalloc", 2), Some("cudaErrorMemoryAllocation"));
        assert_eq!(cuda_error_name("cudaMallocAsync", 801), Some("cudaErrorNotSupported"));
        assert_eq!(cuda_error_name("c10::reportMemoryUsageToProfiler(+)", 2), None);
        assert_eq!(error_label("cuMemMap", 12345), "error 12345");
        assert_eq!(classify("cudaMalloc", 2), Failed::OutOfMemory);
        assert_eq!(classify("cuMemCreate", 2), Failed::OutOfMemory);
        assert_eq!(classify("cuMemCreate", 800), Failed::Probe);
        assert_eq!(classify("cuMemCreate", 801), Failed::Probe);
        assert_eq!(classify("cudaMalloc", 800), Failed::Other);
        assert_eq!(classify("cuMemCreate", 1), Failed::Other);
    }
}
