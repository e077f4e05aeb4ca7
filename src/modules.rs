//! The loaded objects of the process (executable and shared libraries), from `dl_iterate_phdr`:
//! where each is mapped and its GNU build-id. The trace carries them so the CLI can symbolize
//! offline; `resolve` uses them to find real functions and emulate `RTLD_NEXT`.

use std::ops::ControlFlow;

use crate::phdr::each_loaded;

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
    each_loaded(|o| {
        let name = o.name.to_str().unwrap_or("");
        let is_main = o.index == 0 && name.is_empty();
        if name.is_empty() && !is_main {
            return ControlFlow::Continue(()); // the vDSO: no file to symbolize from
        }
        let path = if is_main {
            std::fs::read_link("/proc/self/exe").map(|p| p.to_string_lossy().into_owned()).unwrap_or_default()
        } else {
            name.to_owned()
        };
        let segments = o.segments().map(|(s, e, _)| (s, e)).collect();
        // Linkers often make two PT_NOTE segments (8- and 4-aligned notes): look in each.
        let build_id = o
            .phdrs
            .iter()
            .filter(|ph| ph.p_type == libc::PT_NOTE)
            .find_map(|ph| {
                // SAFETY: PT_NOTE segments are mapped (they lie inside a PT_LOAD) and p_memsz
                // bytes long, while the object is loaded (we are inside the loader's walk).
                let notes = unsafe { std::slice::from_raw_parts(o.bias.wrapping_add(ph.p_vaddr) as *const u8, ph.p_memsz as usize) };
                find_build_id(notes)
            })
            .unwrap_or_default();
        out.push(Object { path, is_main, bias: o.bias, segments, build_id });
        ControlFlow::Continue(())
    });
    out
}

/// How many objects the loader has loaded so far (glibc's `dlpi_adds`): it changes with every
/// `dlopen` that maps something, so a watcher can rescan exactly then.
pub fn load_count() -> u64 {
    crate::phdr::loader_counters().0
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
