//! CPython's memory layouts, per version: the offsets the frame walker in `python` reads
//! (thread state, frames, code objects), from the headers of 3.10-3.12 and, for 3.13, from the
//! interpreter's own `_Py_DebugOffsets`; and the checked reads it makes with them.

#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub minor: u32,
    /// tstate -> `frame` (3.10), `cframe` (3.11, 3.12) or `current_frame` (3.13).
    pub tstate_frame: usize,
    /// `_PyCFrame.current_frame` (3.11, 3.12).
    pub cframe_current: Option<usize>,
    pub frame_code: usize,
    pub frame_previous: usize,
    /// `prev_instr` / `instr_ptr` (pointers), or `f_lasti` (3.10, an int counting code units).
    pub frame_instr: usize,
    /// 3.11: `is_entry` (bool).
    pub frame_is_entry: Option<usize>,
    /// 3.12+: `owner` (char); `FRAME_OWNED_BY_CSTACK` frames are the interpreter's entry shims.
    pub frame_owner: Option<usize>,
    pub code_firstlineno: usize,
    pub code_filename: usize,
    pub code_name: usize,
    pub code_qualname: Option<usize>,
    pub code_linetable: usize,
    /// Start of the bytecode in the code object (3.11+).
    pub code_adaptive: usize,
    /// `sizeof(PyASCIIObject)`, `sizeof(PyCompactUnicodeObject)`: where string data starts.
    pub ascii_size: usize,
    pub compact_size: usize,
    pub linetable_format: u8,
    /// 3.12+: `co_version`, a number the interpreter gives each code object it creates, from a
    /// counter that only grows (0 once it has run out): with the code object's address it tells
    /// a code object from one that took a freed one's place, without reading its strings.
    pub code_version: Option<usize>,
}

pub const FRAME_OWNED_BY_CSTACK: u8 = 3;

impl Layout {
    /// Offsets of the GIL build on x86-64/aarch64 (LP64), from the CPython headers.
    pub fn for_minor(minor: u32) -> Option<Layout> {
        Some(match minor {
            10 => Layout {
                minor,
                tstate_frame: 24,
                cframe_current: None,
                frame_code: 32,
                frame_previous: 24,
                frame_instr: 96,
                frame_is_entry: None,
                frame_owner: None,
                code_firstlineno: 40,
                code_filename: 104,
                code_name: 112,
                code_qualname: None,
                code_linetable: 120,
                code_adaptive: 0,
                ascii_size: 48,
                compact_size: 72,
                linetable_format: 1,
                code_version: None,
            },
            11 => Layout {
                minor,
                tstate_frame: 56,
                cframe_current: Some(8),
                frame_code: 32,
                frame_previous: 48,
                frame_instr: 56,
                frame_is_entry: Some(68),
                frame_owner: None,
                code_firstlineno: 72,
                code_filename: 112,
                code_name: 120,
                code_qualname: Some(128),
                code_linetable: 136,
                code_adaptive: 184,
                ascii_size: 48,
                compact_size: 72,
                linetable_format: 2,
                code_version: None,
            },
            12 => Layout {
                minor,
                tstate_frame: 56,
                cframe_current: Some(0),
                frame_code: 0,
                frame_previous: 8,
                frame_instr: 56,
                frame_is_entry: None,
                frame_owner: Some(70),
                code_firstlineno: 68,
                code_filename: 112,
                code_name: 120,
                code_qualname: Some(128),
                code_linetable: 136,
                code_adaptive: 192,
                ascii_size: 40,
                compact_size: 56,
                linetable_format: 2,
                code_version: Some(92),
            },
            // 3.13: these are the header values; `debug_offsets` replaces them with what the
            // running interpreter publishes.
            13 => Layout {
                minor,
                tstate_frame: 72,
                cframe_current: None,
                frame_code: 0,
                frame_previous: 8,
                frame_instr: 56,
                frame_is_entry: None,
                frame_owner: Some(70),
                code_firstlineno: 68,
                code_filename: 112,
                code_name: 120,
                code_qualname: Some(128),
                code_linetable: 136,
                code_adaptive: 200,
                ascii_size: 40,
                compact_size: 56,
                linetable_format: 2,
                code_version: Some(92),
            },
            _ => return None,
        })
    }
}

/// "3.12.3 (main, ...) [GCC ...]" -> (3, 12).
pub fn parse_version(v: &str) -> Option<(u32, u32)> {
    let head = v.split_whitespace().next()?;
    let mut it = head.split('.');
    let major = it.next()?.parse().ok()?;
    let minor: String = it.next()?.chars().take_while(|c| c.is_ascii_digit()).collect();
    Some((major, minor.parse().ok()?))
}

/// CPython 3.13 publishes the offsets debuggers need in `_PyRuntime` (`_Py_DebugOffsets`, first
/// field). Its 3.13 layout: cookie[8], version u64, free_threaded u64, then u64 offset groups.
pub fn debug_offsets(layout: &mut Layout, rt: u64) -> Result<(), String> {
    if rt == 0 {
        return Err("_PyRuntime not found".into());
    }
    // SAFETY: `_PyRuntime` is a static object of well over 400 bytes starting with the offsets.
    let (cookie, version, free_threaded) = unsafe { (read::<[u8; 8]>(rt), read::<u64>(rt + 8), read::<u64>(rt + 16)) };
    if &cookie != b"xdebugpy" {
        return Err("_Py_DebugOffsets cookie not found".into());
    }
    if version >> 16 != 0x030D {
        return Err(format!("_Py_DebugOffsets has version {version:#x}, expected 3.13"));
    }
    if free_threaded != 0 {
        return Err("a free-threaded build, not supported for Python stacks".into());
    }
    // Group starts, in u64 fields: runtime_state at 3 (3 fields), interpreter_state at 6
    // (13 fields), thread_state at 19 (9), interpreter_frame at 28 (6), code_object at 34 (10).
    // SAFETY: reading u64 fields of the offsets table, all within it.
    let f = |i: u64| unsafe { read::<u64>(rt + 8 * i) } as usize;
    let (ts, fr, co) = (19, 28, 34);
    layout.tstate_frame = f(ts + 4);
    layout.frame_previous = f(fr + 1);
    layout.frame_code = f(fr + 2);
    layout.frame_instr = f(fr + 3);
    layout.frame_owner = Some(f(fr + 5));
    layout.code_filename = f(co + 1);
    layout.code_name = f(co + 2);
    layout.code_qualname = Some(f(co + 3));
    layout.code_linetable = f(co + 4);
    layout.code_firstlineno = f(co + 5);
    layout.code_adaptive = f(co + 9);
    // `co_version` is not published: the header's offset holds while the fields around it
    // are where the header puts them.
    if (layout.code_firstlineno, layout.code_filename) != (68, 112) {
        layout.code_version = None;
    }
    let all = [
        layout.tstate_frame,
        layout.frame_previous,
        layout.frame_code,
        layout.frame_instr,
        layout.code_filename,
        layout.code_name,
        layout.code_linetable,
        layout.code_firstlineno,
        layout.code_adaptive,
    ];
    if all.iter().any(|&o| o > 4096) {
        return Err("_Py_DebugOffsets holds implausible offsets".into());
    }
    Ok(())
}

/// A pointer that can be dereferenced for `align`-aligned reads: non-null, aligned, in the
/// lower half (user space), past the first page.
#[inline]
pub fn plausible(p: u64, align: u64) -> bool {
    debug_assert!(align.is_power_of_two() && align <= 4096);
    // One comparison: rotated, a misaligned address's low bits land on top and make it huge
    // (4096 is a multiple of `align`, so the subtraction keeps them).
    let tz = align.trailing_zeros();
    p.wrapping_sub(4096).rotate_right(tz) < ((1 << 47) - 4096) >> tz
}

/// # Safety
/// `addr` must point to readable memory holding a `T`.
#[inline]
pub unsafe fn read<T: Copy>(addr: u64) -> T {
    // SAFETY: the caller's promise; unaligned reads are allowed.
    unsafe { std::ptr::read_unaligned(addr as *const T) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plausible_pointers_are_aligned_user_space_past_the_first_page() {
        let naive = |p: u64, align: u64| (4096..(1u64 << 47)).contains(&p) && p % align == 0;
        let edges = [0, 1, 7, 8, 4088, 4095, 4096, 4097, 4100, 4104, (1 << 47) - 8, (1 << 47) - 4, (1 << 47) - 1, 1 << 47, (1 << 47) + 8];
        let more = [u64::MAX, u64::MAX - 7, 0x7fff_ffff_f000, 0x5555_5555_4000, 0x5555_5555_4003, 1 << 63];
        for p in edges.into_iter().chain(more) {
            for align in [1, 2, 4, 8, 16] {
                assert_eq!(plausible(p, align), naive(p, align), "{p:#x} aligned to {align}");
            }
        }
    }

    #[test]
    fn versions_parse() {
        assert_eq!(parse_version("3.12.3 (main, Apr 10 2024) [GCC 13.2.0]"), Some((3, 12)));
        assert_eq!(parse_version("3.13.0rc1+ experimental free-threading build"), Some((3, 13)));
        assert_eq!(parse_version("3.10.13"), Some((3, 10)));
        assert_eq!(parse_version("garbage"), None);
    }

    #[test]
    fn layouts_exist_for_supported_versions_only() {
        for m in 10..=13 {
            assert!(Layout::for_minor(m).is_some());
        }
        assert!(Layout::for_minor(9).is_none() && Layout::for_minor(14).is_none());
    }

}
