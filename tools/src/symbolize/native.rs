//! Offline symbolization of the return addresses in a trace, with its module map.
//!
//! A [`Symbolizer`] outlives the traces of one invocation, so that a directory of traces from
//! one job (all loading the same big libraries) parses each object file once.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use addr2line::Loader;
use gpumemtrace_format::Module;
use memmap2::Mmap;
use object::Object;
use serde::Serialize;

/// One symbolized frame. An address inside inlined code yields several, innermost first,
/// all with the same `address`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Frame {
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    /// Path of the module the address lies in.
    pub module: Option<String>,
    /// The raw return address from the trace.
    pub address: u64,
    /// Address relative to the module (`address - bias`), for `module+0xoffset` display.
    #[serde(skip)]
    pub offset: Option<u64>,
    /// A Python frame (function = qualified name, file = `co_filename`); only in JSON when true.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub python: bool,
}

impl Frame {
    /// The module's file name (`libfoo.so`), without its directory.
    pub fn module_name(&self) -> Option<&str> {
        self.module.as_deref().map(file_name)
    }

    /// `function file.c:12`, `function`, `libfoo.so+0x1234` or `0x7f00...`: the best we know.
    pub fn describe(&self) -> String {
        let mut s = match (&self.function, self.module_name(), self.offset) {
            (Some(f), _, _) => f.clone(),
            (None, Some(m), Some(off)) => format!("{m}+{off:#x}"),
            _ => format!("{:#x}", self.address),
        };
        if let Some(file) = &self.file {
            s.push(' ');
            s.push_str(file_name(file));
            if let Some(line) = self.line {
                s.push_str(&format!(":{line}"));
            }
        }
        s
    }
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The debug information of one object file. Loaders are tried in order: a separate debug
/// file (when the object has no DWARF of its own) first, then the object itself.
struct DebugInfo {
    loaders: Vec<Loader>,
    /// The same files mapped, for their ELF symbol tables (read on first need).
    maps: Vec<Mmap>,
    symbols: OnceCell<SymbolTable>,
}

/// Parsed object files, keyed by path and the build-id the trace recorded.
/// `None`: unusable (missing, rebuilt, not an object); warned about once.
#[derive(Default)]
pub struct Symbolizer {
    objects: HashMap<(String, Vec<u8>), Option<DebugInfo>>,
}

/// Set by [`Symbolizer::all_offline`]: no object file is read, frames keep their module and
/// offset (the fuzz targets', where every mutated path or build-id would be another file to parse).
static ALL_OFFLINE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl Symbolizer {
    pub fn new() -> Symbolizer {
        Symbolizer::default()
    }

    /// From now on no symbolizer of this process reads object files (the fuzz target's).
    pub fn all_offline() {
        ALL_OFFLINE.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// A symbolizer for one trace's module map.
    pub fn for_trace<'a>(&'a mut self, modules: &'a [Module]) -> TraceSymbolizer<'a> {
        TraceSymbolizer {
            objects: &mut self.objects,
            modules,
            cache: HashMap::new(),
        }
    }
}

pub struct TraceSymbolizer<'a> {
    objects: &'a mut HashMap<(String, Vec<u8>), Option<DebugInfo>>,
    modules: &'a [Module],
    cache: HashMap<u64, Vec<Frame>>,
}

impl TraceSymbolizer<'_> {
    /// A whole stack, innermost first, inlined frames expanded.
    pub fn stack(&mut self, addrs: &[u64]) -> Vec<Frame> {
        addrs
            .iter()
            .flat_map(|&a| self.address(a).to_vec())
            .collect()
    }

    /// The frames of one return address: the inlined chain, innermost first (at least one).
    pub fn address(&mut self, addr: u64) -> &[Frame] {
        if !self.cache.contains_key(&addr) {
            let frames = self.resolve(addr);
            self.cache.insert(addr, frames);
        }
        &self.cache[&addr]
    }

    fn resolve(&mut self, addr: u64) -> Vec<Frame> {
        // Modules can be unloaded and others loaded at the same place: the last one wins.
        let Some(m) = self
            .modules
            .iter()
            .rev()
            .find(|m| m.start <= addr && addr < m.end)
        else {
            return vec![Frame {
                address: addr,
                ..Frame::default()
            }];
        };
        let offset = addr.wrapping_sub(m.bias);
        let bare = Frame {
            module: Some(m.path.clone()),
            address: addr,
            offset: Some(offset),
            ..Frame::default()
        };
        if ALL_OFFLINE.load(std::sync::atomic::Ordering::Relaxed) {
            return vec![bare];
        }
        let debug = self
            .objects
            .entry((m.path.clone(), m.build_id.clone()))
            .or_insert_with(|| {
                DebugInfo::open(m)
                    .map_err(|e| eprintln!("warning: {}", crate::units::printable(&e)))
                    .ok()
                    .flatten()
            });
        let Some(debug) = debug else {
            return vec![bare];
        };
        // A return address points after the call; the call itself is one byte earlier.
        let found = debug.lookup(offset.wrapping_sub(1));
        if found.is_empty() {
            return vec![bare];
        }
        found
            .into_iter()
            .map(|(function, file, line)| Frame {
                function,
                file,
                line,
                ..bare.clone()
            })
            .collect()
    }
}

type Location = (Option<String>, Option<String>, Option<u32>);

impl DebugInfo {
    /// `Ok(None)` for pseudo-modules with no file, such as linux-vdso.so.1: nothing to warn about.
    fn open(m: &Module) -> Result<Option<DebugInfo>, String> {
        if !m.path.starts_with('/') {
            return Ok(None);
        }
        let fallback = format!(
            "addresses in it are shown as {}+0xoffset",
            file_name(&m.path)
        );
        // Never a FIFO or a device (it would hang us): see `files`.
        let file = super::files::open_regular(Path::new(&m.path))
            .map_err(|e| format!("cannot open {}: {e}; {fallback}", m.path))?;
        // SAFETY: read-only mapping; a file changed under us gives wrong names, not UB in practice.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| format!("cannot map {}: {e}", m.path))?;
        let obj = object::File::parse(&*map).map_err(|e| format!("{}: {e}; {fallback}", m.path))?;
        let on_disk = obj.build_id().ok().flatten();
        if let Some(id) = on_disk {
            if !m.build_id.is_empty() && id != m.build_id.as_slice() {
                return Err(format!(
                    "{} on disk (build-id {}) is not the one traced (build-id {}); {fallback}",
                    m.path,
                    hex(id),
                    hex(&m.build_id)
                ));
            }
        }
        let mut loaders = Vec::new();
        let mut maps = Vec::new();
        let has_dwarf = obj.section_by_name(".debug_info").is_some()
            || obj.section_by_name(".zdebug_info").is_some();
        if !has_dwarf {
            let build_id = on_disk.unwrap_or(&m.build_id);
            if let Some((l, debug_map)) = debug_file_candidates(Path::new(&m.path), build_id, &obj)
                .into_iter()
                .find(|p| super::files::is_regular(p))
                .and_then(|p| {
                    // SAFETY: as above.
                    let map = super::files::open_regular(&p).and_then(|f| unsafe { Mmap::map(&f) }).ok()?;
                    let l = Loader::new(&p).ok()?;
                    Some((l, map))
                })
            {
                loaders.push(l);
                maps.push(debug_map);
            }
        }
        loaders.push(Loader::new(&m.path).map_err(|e| format!("{}: {e}; {fallback}", m.path))?);
        maps.push(map);
        Ok(Some(DebugInfo {
            loaders,
            maps,
            symbols: OnceCell::new(),
        }))
    }

    /// Function, file and line at a file-relative address, inlined chain innermost first.
    /// Uses DWARF when some loader has it there, else the symbol table.
    fn lookup(&self, probe: u64) -> Vec<Location> {
        for l in &self.loaders {
            let mut out = Vec::new();
            if let Ok(mut frames) = l.find_frames(probe) {
                while let Ok(Some(f)) = frames.next() {
                    let function = f
                        .function
                        .as_ref()
                        .and_then(|n| n.demangle().ok())
                        .map(Cow::into_owned);
                    let (file, line) = f
                        .location
                        .map_or((None, None), |l| (l.file.map(str::to_owned), l.line));
                    out.push((function, file, line));
                }
            }
            if out.iter().any(|(f, _, _)| f.is_some()) {
                return out;
            }
        }
        // No DWARF function: the symbol table (.symtab or .dynsym) names it if the address lies
        // inside a symbol, maybe with a line from a line table. The nearest symbol below is no
        // name: in a stripped library that is whichever export happens to come before.
        let function = self
            .symbols
            .get_or_init(|| SymbolTable::new(&self.maps))
            .find(&self.maps, probe)
            .map(|s| addr2line::demangle_auto(s, None).into_owned());
        let location = self
            .loaders
            .iter()
            .find_map(|l| l.find_location(probe).ok().flatten());
        let (file, line) = location.map_or((None, None), |l| (l.file.map(str::to_owned), l.line));
        if function.is_none() && file.is_none() {
            return Vec::new();
        }
        vec![(function, file, line)]
    }
}

/// One ELF symbol: `[start, end)` in the object's addresses, its name a range of `maps[map]`.
#[derive(Clone, Copy, Debug)]
struct Sym {
    start: u64,
    end: u64,
    global: bool,
    map: usize,
    name: (usize, usize),
}

/// The function symbols of a module (`.symtab` and `.dynsym` of the object and of its separate
/// debug file). An address is named by a symbol only when it lies inside it
/// (`st_value <= a < st_value + st_size`), by one of size 0 only at exactly its address.
struct SymbolTable {
    /// Symbols with a size, by start, then the larger first, then locals first: a backward
    /// walk meets the innermost (and, among equals, a global) first.
    sized: Vec<Sym>,
    /// `max_end[i]`: the largest end among `sized[..=i]`, where the backward walk can stop.
    max_end: Vec<u64>,
    /// Symbols of size 0, by start.
    points: Vec<Sym>,
}

impl SymbolTable {
    fn new(maps: &[Mmap]) -> SymbolTable {
        use object::{ObjectSymbol, SymbolKind, SymbolSection};
        let mut sized = Vec::new();
        let mut points = Vec::new();
        for (i, map) in maps.iter().enumerate() {
            let Ok(obj) = object::File::parse(&**map) else {
                continue;
            };
            for s in obj.symbols().chain(obj.dynamic_symbols()) {
                // Code: functions, and labels of no type (assembly); not data, sections, files.
                if !matches!(
                    s.kind(),
                    SymbolKind::Text | SymbolKind::Unknown | SymbolKind::Label
                ) || !matches!(s.section(), SymbolSection::Section(_))
                {
                    continue;
                }
                let Ok(name) = s.name_bytes() else { continue };
                if name.is_empty() {
                    continue;
                }
                let sym = Sym {
                    start: s.address(),
                    end: s.address().saturating_add(s.size()),
                    global: s.is_global(),
                    map: i,
                    name: (name.as_ptr() as usize - map.as_ptr() as usize, name.len()),
                };
                if s.size() == 0 {
                    points.push(sym);
                } else {
                    sized.push(sym);
                }
            }
        }
        sized.sort_by_key(|s| (s.start, std::cmp::Reverse(s.end), s.global));
        points.sort_by_key(|s| (s.start, s.global));
        let max_end = sized
            .iter()
            .scan(0, |m, s| {
                *m = s.end.max(*m);
                Some(*m)
            })
            .collect();
        SymbolTable {
            sized,
            max_end,
            points,
        }
    }

    /// The name of the symbol `addr` lies in, if any.
    fn find<'m>(&self, maps: &'m [Mmap], addr: u64) -> Option<Cow<'m, str>> {
        let below = self.sized.partition_point(|s| s.start <= addr);
        let inside = (0..below)
            .rev()
            .take_while(|&i| self.max_end[i] > addr)
            .map(|i| &self.sized[i])
            .find(|s| addr < s.end);
        let exact = || {
            let after = self.points.partition_point(|s| s.start <= addr);
            after
                .checked_sub(1)
                .map(|i| &self.points[i])
                .filter(|s| s.start == addr)
        };
        let s = inside.or_else(exact)?;
        let (off, len) = s.name;
        Some(String::from_utf8_lossy(&maps[s.map][off..off + len]))
    }
}

/// Where distributions put separate debug files: by build-id, then by .gnu_debuglink next to
/// the object, in its .debug directory, and under /usr/lib/debug.
fn debug_file_candidates(path: &Path, build_id: &[u8], obj: &object::File) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if build_id.len() > 1 {
        let h = hex(build_id);
        v.push(PathBuf::from(format!(
            "/usr/lib/debug/.build-id/{}/{}.debug",
            &h[..2],
            &h[2..]
        )));
    }
    if let (Ok(Some((name, _crc))), Some(dir)) = (obj.gnu_debuglink(), path.parent()) {
        let name = String::from_utf8_lossy(name).into_owned();
        v.push(dir.join(&name));
        v.push(dir.join(".debug").join(&name));
        v.push(
            Path::new("/usr/lib/debug")
                .join(dir.strip_prefix("/").unwrap_or(dir))
                .join(&name),
        );
    }
    v.retain(|p| p != path);
    v
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::fs::File;

    #[inline(never)]
    pub(crate) fn probe_target(x: u64) -> u64 {
        std::hint::black_box(x).wrapping_mul(3)
    }

    /// The Module record the tracer would write for the object containing `addr`.
    pub(crate) fn module_containing(addr: u64) -> Module {
        struct Search {
            addr: u64,
            found: Option<Module>,
        }
        unsafe extern "C" fn callback(
            info: *mut libc::dl_phdr_info,
            _size: libc::size_t,
            data: *mut libc::c_void,
        ) -> libc::c_int {
            let s = &mut *(data as *mut Search);
            let info = &*info;
            let phdrs = std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize);
            let (mut start, mut end) = (u64::MAX, 0);
            for p in phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD) {
                start = start.min(info.dlpi_addr + p.p_vaddr);
                end = end.max(info.dlpi_addr + p.p_vaddr + p.p_memsz);
            }
            if start <= s.addr && s.addr < end {
                let name = std::ffi::CStr::from_ptr(info.dlpi_name)
                    .to_string_lossy()
                    .into_owned();
                // The main program has an empty name.
                let path = if name.is_empty() {
                    std::env::current_exe().unwrap().display().to_string()
                } else {
                    name
                };
                let data = std::fs::read(&path).unwrap();
                let build_id = object::File::parse(&*data)
                    .unwrap()
                    .build_id()
                    .unwrap()
                    .unwrap_or_default()
                    .to_vec();
                s.found = Some(Module {
                    id: 1,
                    bias: info.dlpi_addr,
                    start,
                    end,
                    path,
                    build_id,
                });
                return 1;
            }
            0
        }
        let mut s = Search { addr, found: None };
        unsafe {
            libc::dl_iterate_phdr(Some(callback), &mut s as *mut Search as *mut libc::c_void)
        };
        s.found.expect("no loaded object contains the address")
    }

    #[test]
    fn symbolizes_a_function_of_this_test_binary() {
        let addr = probe_target as *const () as usize as u64;
        assert_eq!(probe_target(1), 3);
        let module = module_containing(addr);
        let modules = [module.clone()];
        let mut sym = Symbolizer::new();
        let mut t = sym.for_trace(&modules);
        // As if a call returned to the function's second byte: the lookup is of its first.
        let frames = t.address(addr + 1).to_vec();
        let f = &frames[0];
        assert!(
            f.function
                .as_deref()
                .unwrap()
                .ends_with("symbolize::native::tests::probe_target"),
            "{f:?}"
        );
        assert!(
            f.file
                .as_deref()
                .unwrap()
                .ends_with("tools/src/symbolize/native.rs"),
            "{f:?}"
        );
        assert!(f.line.is_some());
        assert_eq!(
            (f.address, f.module.as_deref()),
            (addr + 1, Some(module.path.as_str()))
        );
        assert!(
            f.describe()
                .starts_with("gpumemtrace_cli::symbolize::native::tests::probe_target native.rs:"),
            "{}",
            f.describe()
        );
    }

    #[test]
    fn missing_or_rebuilt_modules_fall_back_to_module_offset() {
        let exe = std::env::current_exe().unwrap().display().to_string();
        let modules = [
            Module {
                id: 1,
                bias: 0x1000_0000,
                start: 0x1000_0000,
                end: 0x1100_0000,
                path: "/nonexistent/libfoo.so".into(),
                build_id: vec![],
            },
            Module {
                id: 2,
                bias: 0x2000_0000,
                start: 0x2000_0000,
                end: 0x2100_0000,
                path: exe,
                build_id: vec![1, 2, 3, 4],
            },
        ];
        let mut sym = Symbolizer::new();
        let mut t = sym.for_trace(&modules);
        let f = t.address(0x1000_1234)[0].clone();
        assert_eq!(
            (f.function.as_deref(), f.offset, f.describe()),
            (None, Some(0x1234), "libfoo.so+0x1234".to_string())
        );
        // The test binary on disk is not the one with build-id 01020304 the "trace" recorded.
        let f = t.address(0x2000_0010)[0].clone();
        let data = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        if object::File::parse(&*data)
            .unwrap()
            .build_id()
            .unwrap()
            .is_some()
        {
            assert_eq!(
                (f.function.as_deref(), f.describe()),
                (None, format!("{}+0x10", f.module_name().unwrap()))
            );
        }
        let unmapped = t.address(0x42)[0].clone();
        assert_eq!(
            (unmapped.module.as_deref(), unmapped.describe()),
            (None, "0x42".to_string())
        );
    }

    /// A small shared library built with gcc, unstripped and stripped (only `.dynsym` left).
    fn symbol_test_library() -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("gpumemtrace-symtest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("symtest.c");
        std::fs::write(
            &src,
            r#"
int exported_first(int x) { return x * 3 + 1; }
static int __attribute__((noinline)) hidden_helper(int x) { volatile int y = x; return y * 7 + y / 3; }
int exported_second(int x) { return hidden_helper(x) + 2; }
/* A label with a type and no size, as assembly often has, with room after it. */
__asm__(".text\n.globl zero_size_mark\n.type zero_size_mark,@function\nzero_size_mark:\n ret\n nop\n nop\n nop\n nop\n");
"#,
        )
        .unwrap();
        let full = dir.join("libsymtest.so");
        let stripped = dir.join("libsymtest-stripped.so");
        let st = std::process::Command::new("gcc")
            // In source order: an export lies just below the static function.
            .args(["-shared", "-fPIC", "-O1", "-fno-toplevel-reorder", "-o"])
            .arg(&full)
            .arg(&src)
            .status()
            .expect("gcc is needed for this test");
        assert!(st.success());
        let st = std::process::Command::new("strip")
            .arg("-o")
            .arg(&stripped)
            .arg(&full)
            .status()
            .expect("strip (binutils) is needed for this test");
        assert!(st.success());
        (full, stripped)
    }

    /// Address and size of a symbol, from the unstripped library's `.symtab`.
    fn symbol(path: &Path, name: &str) -> (u64, u64) {
        use object::ObjectSymbol;
        let data = std::fs::read(path).unwrap();
        let obj = object::File::parse(&*data).unwrap();
        let s = obj
            .symbols()
            .find(|s| s.name() == Ok(name))
            .unwrap_or_else(|| panic!("no symbol {name} in {}", path.display()));
        (s.address(), s.size())
    }

    /// The name and description of the frame of return address `ra` in a library loaded at 0.
    fn name_at(path: &Path, ra: u64) -> (Option<String>, String) {
        let modules = [Module {
            id: 1,
            bias: 0,
            start: 0,
            end: u64::MAX,
            path: path.display().to_string(),
            build_id: vec![],
        }];
        let mut sym = Symbolizer::new();
        let mut t = sym.for_trace(&modules);
        let f = t.address(ra)[0].clone();
        (f.function.clone(), f.describe())
    }

    #[test]
    fn symbols_name_only_addresses_inside_them() {
        let (full, stripped) = symbol_test_library();
        let (first, first_size) = symbol(&full, "exported_first");
        let (hidden, hidden_size) = symbol(&full, "hidden_helper");
        let (mark, mark_size) = symbol(&full, "zero_size_mark");
        assert!(first_size > 0 && hidden_size > 1 && mark_size == 0);
        // The case of cuBLAS: the nearest export below the static function is another one.
        assert!(first + first_size <= hidden);
        // A return address in the middle of a function: the call is one byte earlier.
        let mid = |start: u64, size: u64| start + size / 2 + 1;

        for lib in [&full, &stripped] {
            // Exported (in .dynsym as well as .symtab): named in both copies.
            assert_eq!(
                name_at(lib, mid(first, first_size)).0.as_deref(),
                Some("exported_first"),
                "{}",
                lib.display()
            );
            // A size-0 symbol names its own address only.
            assert_eq!(name_at(lib, mark + 1).0.as_deref(), Some("zero_size_mark"));
            let (f, d) = name_at(lib, mark + 2);
            assert_eq!(f, None, "{d}");
            assert_eq!(
                d,
                format!("{}+{:#x}", file_name(&lib.display().to_string()), mark + 2)
            );
        }
        // The static function: named from .symtab where it is there...
        assert_eq!(
            name_at(&full, mid(hidden, hidden_size)).0.as_deref(),
            Some("hidden_helper")
        );
        // ...and in the stripped copy not after whichever export lies below it, but
        // `library+0xoffset`.
        let ra = mid(hidden, hidden_size);
        let (f, d) = name_at(&stripped, ra);
        assert_eq!(f, None, "{d}");
        assert_eq!(d, format!("libsymtest-stripped.so+{ra:#x}"));
        let _ = std::fs::remove_dir_all(full.parent().unwrap());
    }

    #[test]
    fn innermost_containing_symbol_wins() {
        // Built by hand: [0x100, 0x200) outer, [0x140, 0x160) inner, 0x300 a size-0 label.
        let names = b"outerinnerlabel";
        let dir = std::env::temp_dir().join(format!("gpumemtrace-symnames-{}", std::process::id()));
        std::fs::write(&dir, names).unwrap();
        let map = unsafe { Mmap::map(&File::open(&dir).unwrap()) }.unwrap();
        let _ = std::fs::remove_file(&dir);
        let sym = |start, end, name| Sym {
            start,
            end,
            global: true,
            map: 0,
            name,
        };
        let mut sized = vec![sym(0x100, 0x200, (0, 5)), sym(0x140, 0x160, (5, 5))];
        sized.sort_by_key(|s| (s.start, std::cmp::Reverse(s.end), s.global));
        let t = SymbolTable {
            max_end: vec![0x200, 0x200],
            sized,
            points: vec![sym(0x300, 0x300, (10, 5))],
        };
        let maps = [map];
        let at = |a| t.find(&maps, a).map(Cow::into_owned);
        assert_eq!(at(0xff), None);
        assert_eq!(at(0x100).as_deref(), Some("outer"));
        assert_eq!(at(0x150).as_deref(), Some("inner"));
        assert_eq!(at(0x160).as_deref(), Some("outer"));
        assert_eq!(at(0x1ff).as_deref(), Some("outer"));
        assert_eq!(at(0x200), None);
        assert_eq!(at(0x300).as_deref(), Some("label"));
        assert_eq!(at(0x301), None);
    }
}
