//! Python frames in reports: instruction offsets to lines (CPython's line tables), merging
//! Python frames into native stacks, and which Python files are the user's own code.

use gpumemtrace_format::{line_table_format, PyCode, PyFrame};

use super::native::Frame;

/// The line of the instruction at byte offset `offset` of `code`; `None` when the table says
/// the instruction has no line, or there is no table.
pub fn line_of(code: &PyCode, offset: u32) -> Option<u32> {
    match code.linetable_format {
        line_table_format::PY310 => line_310(&code.linetable, code.firstlineno, offset),
        line_table_format::PY311 => line_311(&code.linetable, code.firstlineno, offset),
        _ => Some(code.firstlineno),
    }
}

/// CPython 3.10 `co_linetable`: pairs (bytes covered: u8, line delta: i8; -128 = no line).
fn line_310(table: &[u8], first: u32, offset: u32) -> Option<u32> {
    let mut line = first as i64;
    let mut start = 0u32;
    for pair in table.chunks_exact(2) {
        let end = start + pair[0] as u32;
        let delta = pair[1] as i8;
        let this = if delta == -128 {
            None
        } else {
            line += delta as i64;
            Some(line)
        };
        if start <= offset && offset < end {
            return this.and_then(|l| u32::try_from(l).ok());
        }
        start = end;
    }
    None
}

/// CPython 3.11+ location table (Objects/locations.md): entries of a header byte
/// `1 code:4 (length-1):3` (length in 2-byte code units) and code-dependent payload.
fn line_311(table: &[u8], first: u32, offset: u32) -> Option<u32> {
    let unit = offset / 2;
    let mut line = first as i64;
    let mut addr = 0u32;
    let mut i = 0;
    let varint = |i: &mut usize| -> Option<u64> {
        let (mut v, mut shift) = (0u64, 0);
        loop {
            let b = *table.get(*i)?;
            *i += 1;
            v |= ((b & 63) as u64) << shift;
            shift += 6;
            if b & 64 == 0 || shift > 60 {
                return Some(v);
            }
        }
    };
    let svarint = |i: &mut usize| -> Option<i64> {
        let v = varint(i)?;
        Some(if v & 1 == 1 { -((v >> 1) as i64) } else { (v >> 1) as i64 })
    };
    while i < table.len() {
        let head = table[i];
        i += 1;
        if head & 0x80 == 0 {
            return None; // lost sync: corrupt or cut table
        }
        let code = (head >> 3) & 15;
        let len = (head & 7) as u32 + 1;
        let this = match code {
            15 => None,
            14 => {
                line += svarint(&mut i)?;
                varint(&mut i)?; // end line delta
                varint(&mut i)?; // start column
                varint(&mut i)?; // end column
                Some(line)
            }
            13 => {
                line += svarint(&mut i)?;
                Some(line)
            }
            10..=12 => {
                line += (code - 10) as i64;
                i += 2;
                Some(line)
            }
            _ => {
                i += 1;
                Some(line)
            }
        };
        if addr <= unit && unit < addr + len {
            return this.and_then(|l| u32::try_from(l).ok());
        }
        addr += len;
    }
    None
}

/// A Python frame as a report frame: function = qualified name, file = `co_filename`.
pub fn frame(code: Option<&PyCode>, f: &PyFrame) -> Frame {
    Frame {
        function: Some(code.map_or("<unknown>".into(), |c| c.qualname.clone())),
        file: code.map(|c| c.filename.clone()),
        line: code.and_then(|c| line_of(c, f.instr_offset)),
        python: true,
        ..Frame::default()
    }
}

/// The interpreter loop: each native frame of it ran one run of Python frames.
fn is_eval_frame(f: &Frame) -> bool {
    f.function.as_deref().is_some_and(|n| n.starts_with("_PyEval_EvalFrameDefault"))
}

/// The interpreter's own code: libpython, or a python executable it is linked into.
pub fn is_interpreter(f: &Frame) -> bool {
    f.module_name().is_some_and(|m| m.starts_with("libpython") || (m.starts_with("python") && !m.contains(".so")))
}

/// Merges a native stack (innermost first) with a Python stack (innermost first, with entry
/// flags), as memray's native mode does: each native `_PyEval_EvalFrameDefault` frame becomes
/// the run of Python frames it was executing (up to and including its entry frame); the
/// interpreter's other native frames are dropped; other native frames stay where they are
/// (those below the innermost Python frame above all). Python frames the native stack did not
/// reach (it is cut at the configured depth) go at the outer end.
pub fn merge(native: Vec<Frame>, python: Vec<Frame>, entry: &[bool]) -> Vec<Frame> {
    if python.is_empty() {
        return native;
    }
    let mut out = Vec::with_capacity(native.len() + python.len());
    let mut next = 0;
    for f in native {
        if is_eval_frame(&f) && !seen_eval_inline(&out, &f) {
            while next < python.len() {
                out.push(python[next].clone());
                next += 1;
                if entry[next - 1] {
                    break;
                }
            }
        } else if !is_interpreter(&f) {
            out.push(f);
        }
    }
    out.extend(python[next..].iter().cloned());
    out
}

/// An inlined chain expands one address into several frames; only one of them stands for the
/// interpreter-loop invocation (they share the address).
fn seen_eval_inline(out: &[Frame], f: &Frame) -> bool {
    out.last().is_some_and(|l| l.python && l.address == f.address && f.address != 0)
}

/// True for Python code that is the user's own: not installed packages (`site-packages`,
/// `dist-packages`), not the standard library (`.../lib/python3.N/...`), not frozen or
/// generated code (`<frozen ...>`, `<string>`).
pub fn is_user_code(f: &Frame) -> bool {
    let Some(file) = f.file.as_deref() else { return false };
    if file.starts_with('<') || file.contains("/site-packages/") || file.contains("/dist-packages/") {
        return false;
    }
    !is_stdlib_path(file)
}

fn is_stdlib_path(file: &str) -> bool {
    // ".../lib/python3.11/x.py", ".../lib64/python3.12/...", "/usr/lib/python3/dist-packages" (above)
    for marker in ["/lib/python3", "/lib64/python3"] {
        if let Some(i) = file.find(marker) {
            let rest = &file[i + marker.len()..];
            let rest = rest.strip_prefix('.').unwrap_or(rest);
            let digits = rest.chars().take_while(|c| c.is_ascii_digit()).count();
            if rest[digits..].starts_with('/') {
                return true;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// `testdata/linetables.json`: for each CPython version here, code objects of
    /// `testdata/linetables_src.py` with their `co_linetable`, `co_firstlineno` and the line of
    /// every instruction offset as the interpreter itself reports it (`dump_linetables.py`).
    #[test]
    fn line_tables_match_cpython() {
        let data: Value = serde_json::from_str(include_str!("../../testdata/linetables.json")).unwrap();
        let mut checked = 0;
        for (version, codes) in data.as_object().unwrap() {
            for c in codes.as_array().unwrap() {
                let hex = c["linetable"].as_str().unwrap();
                let table: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
                let code = PyCode {
                    name: c["name"].as_str().unwrap().into(),
                    firstlineno: c["firstlineno"].as_u64().unwrap() as u32,
                    linetable_format: c["format"].as_u64().unwrap() as u8,
                    linetable: table,
                    ..PyCode::default()
                };
                for pair in c["lines"].as_array().unwrap() {
                    let offset = pair[0].as_u64().unwrap() as u32;
                    let want = pair[1].as_u64().map(|l| l as u32);
                    assert_eq!(line_of(&code, offset), want, "{version} {} offset {offset}", code.name);
                    checked += 1;
                }
            }
        }
        assert!(checked > 100, "{checked}");
    }

    fn native(function: &str, module: &str, address: u64) -> Frame {
        Frame { function: Some(function.into()), module: Some(module.into()), address, ..Frame::default() }
    }

    fn py(name: &str, file: &str) -> Frame {
        Frame { function: Some(name.into()), file: Some(file.into()), python: true, ..Frame::default() }
    }

    #[test]
    fn merge_replaces_eval_frames_with_their_python_runs() {
        let n = vec![
            native("cuMemAlloc_v2", "/x/libcuda.so.1", 1),
            native("ffi_call", "/usr/lib/libffi.so.8", 2),
            native("_ctypes_callproc", "/py/lib/_ctypes.cpython-311.so", 3),
            native("_PyObject_MakeTpCall", "/py/lib/libpython3.11.so.1.0", 4),
            native("_PyEval_EvalFrameDefault", "/py/lib/libpython3.11.so.1.0", 5),
            native("torch_fn", "/t/libtorch_python.so", 6),
            native("_PyEval_EvalFrameDefault", "/py/lib/libpython3.11.so.1.0", 7),
            native("Py_RunMain", "/py/lib/libpython3.11.so.1.0", 8),
            native("main", "/py/bin/python3.11", 9),
            native("__libc_start_main", "/lib/libc.so.6", 10),
        ];
        let p = vec![py("inner", "a.py"), py("mid", "a.py"), py("outer", "a.py"), py("<module>", "a.py")];
        let merged = merge(n, p, &[false, true, false, true]);
        let names: Vec<&str> = merged.iter().map(|f| f.function.as_deref().unwrap()).collect();
        assert_eq!(
            names,
            ["cuMemAlloc_v2", "ffi_call", "_ctypes_callproc", "inner", "mid", "torch_fn", "outer", "<module>", "__libc_start_main"]
        );
        // A cut native stack: the Python frames it did not reach go at the end.
        let n = vec![native("cuMemAlloc_v2", "/x/libcuda.so.1", 1), native("_PyEval_EvalFrameDefault", "/p/libpython3.12.so", 2)];
        let p = vec![py("inner", "a.py"), py("outer", "a.py")];
        let merged = merge(n, p, &[true, true]);
        let names: Vec<&str> = merged.iter().map(|f| f.function.as_deref().unwrap()).collect();
        assert_eq!(names, ["cuMemAlloc_v2", "inner", "outer"]);
    }

    #[test]
    fn user_code_excludes_libraries_stdlib_and_frozen() {
        let user = ["/home/me/train.py", "train.py", "/work/lib/pythonic/x.py", "/opt/app/lib/python_utils.py"];
        let not = [
            "/usr/lib/python3.11/threading.py",
            "/root/.pyenv/versions/3.12.1/lib/python3.12/sched.py",
            "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py",
            "/usr/lib/python3/dist-packages/numpy/core.py",
            "<frozen runpy>",
            "<string>",
        ];
        for f in user {
            assert!(is_user_code(&py("f", f)), "{f}");
        }
        for f in not {
            assert!(!is_user_code(&py("f", f)), "{f}");
        }
    }
}
