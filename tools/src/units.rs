//! Human-readable sizes, times and CUDA result codes.

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

/// `error 2 (out of memory)`, or `error 12345` for codes without a name.
pub fn cuda_result(code: u32) -> String {
    match cuda_result_name(code) {
        Some(name) => format!("error {code} ({name})"),
        None => format!("error {code}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
