//! What the hook reads of a code object: its signature (what tells it from another code
//! object at the same address) and, the first time the process sees it, what the writer needs
//! to name it (names, file, first line, line table).

use crate::pylayout::{plausible, read, Layout};
use crate::record::CodeInfo;

use super::{Interp, MAX_LINETABLE, MAX_STR};

/// What identifies a code object beyond its address, by what the writer copies of it: the
/// hashes of its name and file name (the `str` objects' own cached hashes), its first line and
/// its line table's address. Pointers alone are not enough: a code object freed and compiled
/// again (generated code, `exec` in a loop, an FX graph recompiled) takes the old one's
/// address, and its name and file strings can take the old strings' addresses too; then
/// its allocations were named, and their lines read, as the old function's. What can still
/// collide is a function of the same name, file and first line whose line table took the old
/// table's address: a function edited and compiled again in place.
///
/// From 3.12 the interpreter numbers the code objects it creates (`co_version`, from a counter
/// that only grows): then the number is the signature, with none of those collisions, and the
/// two `str` objects (lines the running interpreter never touches, so cold on a busy host) are
/// not read. Once the counter has run out (4 billion code objects) new ones get 0, and the
/// strings are read again.
///
/// # Safety
/// `code` must be a live code object.
#[link_section = ".text.hot.gpumemtrace"]
pub(super) unsafe fn signature(at: &SigOffsets, code: u64) -> u64 {
    if let Some(off) = at.version {
        // SAFETY: a field of a live code object (3.12+ layout).
        let version = unsafe { read::<u32>(code + off) };
        if version != 0 {
            return numbered(version);
        }
    }
    // SAFETY: fields of a live code object; its name and file name are live `str` objects
    // (checked non-null and aligned), whose cached hash is at 24 in every supported version.
    let (name, file, table, line) = unsafe {
        (
            str_hash(read::<u64>(code + at.name)),
            str_hash(read::<u64>(code + at.filename)),
            read::<u64>(code + at.linetable),
            read::<u32>(code + at.firstlineno),
        )
    };
    let mut h = 0x9E37_79B9_7F4A_7C15u64;
    for v in [name, file, table, line as u64] {
        h = (h ^ v).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h ^= h >> 31;
    }
    h | 1
}

/// The signature of a code object numbered `version` (not 0): odd, and apart from the strings'
/// signatures only by chance (2^-63).
#[inline(always)]
pub(super) fn numbered(version: u32) -> u64 {
    let mut h = (version as u64 ^ 0xC0DE_0000_0000_0000).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^= h >> 31;
    h | 1
}

/// Where [`signature`] reads a code object's fields (the layout's offsets, as `u64`).
pub(super) struct SigOffsets {
    /// `co_version` (3.12+).
    pub(super) version: Option<u64>,
    pub(super) name: u64,
    pub(super) filename: u64,
    pub(super) linetable: u64,
    pub(super) firstlineno: u64,
}

impl SigOffsets {
    pub(super) fn of(l: &Layout) -> SigOffsets {
        SigOffsets {
            version: l.code_version.map(|o| o as u64),
            name: l.code_name as u64,
            filename: l.code_filename as u64,
            linetable: l.code_linetable as u64,
            firstlineno: l.code_firstlineno as u64,
        }
    }
}

/// A `str`'s cached hash (-1 while never computed; the names of code objects are interned,
/// hashed when interned), else its address.
///
/// # Safety
/// `s` must be null or a live `str`.
#[link_section = ".text.hot.gpumemtrace"]
unsafe fn str_hash(s: u64) -> u64 {
    if !plausible(s, 8) {
        return 0;
    }
    // SAFETY: the caller's promise.
    match unsafe { read::<i64>(s + 24) } {
        -1 => s,
        h => h as u64,
    }
}

/// # Safety
/// `code` must be a live code object.
pub(super) unsafe fn code_info(interp: &Interp, code: u64, sig: u64) -> CodeInfo {
    let l = &interp.layout;
    // SAFETY: fields of a live code object; the objects they point to are read by the checked
    // helpers below.
    unsafe {
        let name = read_str(interp, read(code + l.code_name as u64)).unwrap_or_else(|| "?".into());
        let qualname = match l.code_qualname {
            Some(off) => read_str(interp, read(code + off as u64)).unwrap_or_else(|| name.clone()),
            None => name.clone(),
        };
        let filename = read_str(interp, read(code + l.code_filename as u64)).unwrap_or_else(|| "?".into());
        let firstlineno = read::<i32>(code + l.code_firstlineno as u64).max(0) as u32;
        let linetable = read_bytes(interp, read(code + l.code_linetable as u64));
        let linetable_format = if linetable.is_some() { l.linetable_format } else { 0 };
        CodeInfo { code, sig, name, qualname, filename, firstlineno, linetable_format, linetable: linetable.unwrap_or_default() }
    }
}

/// A `str` object's text (compact strings only, which code objects' strings always are).
///
/// # Safety
/// `s` must be null or point to a live object.
unsafe fn read_str(interp: &Interp, s: u64) -> Option<String> {
    let l = &interp.layout;
    if !plausible(s, 8) {
        return None;
    }
    // SAFETY: a live object; its type is checked before the str fields are read.
    unsafe {
        if read::<u64>(s + 8) != interp.unicode_type {
            return None;
        }
        let len = read::<i64>(s + 16);
        let state = read::<u32>(s + 32);
        if !(0..=MAX_STR as i64).contains(&len) {
            return None;
        }
        let len = len as usize;
        let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
        if compact == 0 {
            return None;
        }
        if ascii == 1 {
            let b = std::slice::from_raw_parts((s + l.ascii_size as u64) as *const u8, len);
            return Some(String::from_utf8_lossy(b).into_owned());
        }
        let data = s + l.compact_size as u64;
        let chars: Option<String> = match kind {
            1 => Some(std::slice::from_raw_parts(data as *const u8, len).iter().map(|&c| c as char).collect()),
            2 => Some((0..len).map(|i| char::from_u32(read::<u16>(data + 2 * i as u64) as u32).unwrap_or('?')).collect()),
            4 => Some((0..len).map(|i| char::from_u32(read::<u32>(data + 4 * i as u64)).unwrap_or('?')).collect()),
            _ => None,
        };
        chars
    }
}

/// A `bytes` object's content, at most [`MAX_LINETABLE`] bytes.
///
/// # Safety
/// `b` must be null or point to a live object.
unsafe fn read_bytes(interp: &Interp, b: u64) -> Option<Vec<u8>> {
    if !plausible(b, 8) {
        return None;
    }
    // SAFETY: a live object, type-checked; ob_size at 16 and the data at 32 (all versions).
    unsafe {
        if read::<u64>(b + 8) != interp.bytes_type {
            return None;
        }
        let len = read::<i64>(b + 16);
        if len < 0 {
            return None;
        }
        let len = (len as usize).min(MAX_LINETABLE);
        Some(std::slice::from_raw_parts((b + 32) as *const u8, len).to_vec())
    }
}

// ---------------------------------------------------------------------------------------------
// Which code objects were already handed to the writer: a direct-mapped table of (address,
// signature). A miss only costs a copy that the writer deduplicates.
