//! The loaded objects of the process (executable and shared libraries), from `dl_iterate_phdr`:
//! where each is mapped and its GNU build-id. The trace carries them so the CLI can symbolize
//! offline; `resolve` uses them to find real functions and emulate `RTLD_NEXT`.

use std::ffi::{c_int, c_void, CStr};

/// One loaded object.
#[derive(Clone, Debug)]
pub struct Object {
    /// Path as the loader knows it; the main program's is read from /proc/self/exe.
    pub path: String,
    /// True for the main program (the loader gives it no name).
    pub is_main: bool,
    /// Load bias (`dlpi_addr`).
    pub bias: u64,
    /// Runtime address ranges of its PT_LOAD segments.
    pub segments: Vec<(u64, u64)>,
    pub build_id: Vec<u8>,
}

impl Object {
    pub fn contains(&self, addr: u64) -> bool {
        self.segments.iter().any(|&(s, e)| addr >= s && addr < e)
    }
    pub fn start(&self) -> u64 {
        self.segments.iter().map(|s| s.0).min().unwrap_or(0)
    }
    pub fn end(&self) -> u64 {
        self.segments.iter().map(|s| s.1).max().unwrap_or(0)
    }
}

/// Every loaded object, in load order (the order symbol lookup uses).
pub fn loaded_objects() -> Vec<Object> {
    let mut out: Vec<Object> = Vec::new();
    // SAFETY: the callback only reads the dl_phdr_info the loader hands it, for the duration
    // of the call, and pushes owned copies into `out`.
    unsafe {
        libc::dl_iterate_phdr(Some(collect), &mut out as *mut Vec<Object> as *mut c_void);
    }
    out
}

/// How many objects the loader has loaded so far (glibc's `dlpi_adds`): it changes with every
/// `dlopen` that maps something, so a watcher can rescan exactly then. Cheap: the walk stops at
/// the first object.
pub fn load_count() -> u64 {
    let mut adds = 0u64;
    // SAFETY: the callback only reads the dl_phdr_info the loader hands it (checking that its
    // size covers `dlpi_adds`), and writes the u64 we pass.
    unsafe {
        libc::dl_iterate_phdr(Some(first_adds), &mut adds as *mut u64 as *mut c_void);
    }
    adds
}

unsafe extern "C" fn first_adds(info: *mut libc::dl_phdr_info, size: usize, data: *mut c_void) -> c_int {
    if size >= std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) {
        // SAFETY: `info` is valid during the call, and its size covers `dlpi_adds`; `data` is
        // the u64 of `load_count`.
        unsafe { *(data as *mut u64) = (*info).dlpi_adds };
    }
    1 // one object is enough
}

unsafe extern "C" fn collect(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
    // Never unwind into the loader.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `data` is the Vec passed by `loaded_objects`; `info` is valid during the call.
        let (out, info) = unsafe { (&mut *(data as *mut Vec<Object>), &*info) };
        let name = if info.dlpi_name.is_null() {
            ""
        } else {
            // SAFETY: the loader's names are NUL-terminated strings.
            unsafe { CStr::from_ptr(info.dlpi_name) }.to_str().unwrap_or("")
        };
        let is_main = out.is_empty() && name.is_empty();
        if name.is_empty() && !is_main {
            return;
        }
        let path = if is_main {
            std::fs::read_link("/proc/self/exe").map(|p| p.to_string_lossy().into_owned()).unwrap_or_default()
        } else {
            name.to_owned()
        };
        let bias = info.dlpi_addr;
        let phdrs = if info.dlpi_phdr.is_null() {
            &[][..]
        } else {
            // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) }
        };
        let mut segments = Vec::new();
        let mut build_id = Vec::new();
        for ph in phdrs {
            match ph.p_type {
                libc::PT_LOAD => segments.push((bias + ph.p_vaddr, bias + ph.p_vaddr + ph.p_memsz)),
                libc::PT_NOTE if build_id.is_empty() => {
                    // SAFETY: PT_NOTE segments are mapped (they lie inside a PT_LOAD) and
                    // p_memsz bytes long.
                    let notes = unsafe {
                        std::slice::from_raw_parts((bias + ph.p_vaddr) as *const u8, ph.p_memsz as usize)
                    };
                    build_id = find_build_id(notes).unwrap_or_default();
                }
                _ => {}
            }
        }
        out.push(Object { path, is_main, bias, segments, build_id });
    }));
    0
}

/// The NT_GNU_BUILD_ID descriptor in a block of ELF notes (bounds-checked).
fn find_build_id(mut notes: &[u8]) -> Option<Vec<u8>> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let word = |b: &[u8], i: usize| -> Option<u32> { Some(u32::from_ne_bytes(b.get(i..i + 4)?.try_into().ok()?)) };
    let align4 = |n: usize| (n + 3) & !3;
    while notes.len() >= 12 {
        let namesz = word(notes, 0)? as usize;
        let descsz = word(notes, 4)? as usize;
        let kind = word(notes, 8)?;
        let name_end = 12usize.checked_add(align4(namesz))?;
        let desc_end = name_end.checked_add(align4(descsz))?;
        if desc_end > notes.len() {
            return None;
        }
        if kind == NT_GNU_BUILD_ID && namesz == 4 && &notes[12..16] == b"GNU\0" {
            return Some(notes[name_end..name_end + descsz].to_vec());
        }
        notes = &notes[desc_end..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_main_program_comes_first_with_its_real_path() {
        let objs = loaded_objects();
        assert!(objs[0].is_main);
        assert_eq!(objs[0].path, std::fs::read_link("/proc/self/exe").unwrap().to_string_lossy());
        let here = the_main_program_comes_first_with_its_real_path as fn() as usize as u64;
        assert!(objs.iter().any(|o| o.contains(here)));
    }

    #[test]
    fn the_load_count_grows_with_a_dlopen() {
        let before = load_count();
        assert!(before >= loaded_objects().len() as u64 - 1, "{before}");
        let lib = std::ffi::CString::new("libutil.so.1").unwrap();
        // SAFETY: dlopen of a system library without constructors of consequence.
        let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "libutil.so.1 (part of glibc) could not be loaded");
        assert_eq!(load_count(), before + 1, "one object mapped");
    }

    #[test]
    fn build_ids_are_found_in_notes() {
        let mut note = Vec::new();
        note.extend_from_slice(&4u32.to_ne_bytes());
        note.extend_from_slice(&3u32.to_ne_bytes());
        note.extend_from_slice(&3u32.to_ne_bytes());
        note.extend_from_slice(b"GNU\0");
        note.extend_from_slice(&[1, 2, 3, 0]);
        assert_eq!(find_build_id(&note), Some(vec![1, 2, 3]));
        assert_eq!(find_build_id(&note[..14]), None);
    }
}
