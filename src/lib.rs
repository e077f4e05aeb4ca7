//! libgpumemtrace.so: records every CUDA memory allocation of the process it is preloaded into.
//!
//! The modules form layers; each depends only on layers below it (a test below keeps it so;
//! docs/architecture.md has the picture and an event's path through them):
//!
//! - Entry points, what the loader and the program reach:
//!   [`hooks`] (the exported hooks and lookup entry points, generated from the table, and
//!   `dlsym`), [`phases`] and [`nvtx`] (phase marks), [`exec`] (finish the trace before `exec*`).
//! - Decisions at the entry: [`routing`] (which hook stands for a function that `dlsym` or
//!   `cuGetProcAddress` returned), [`hotpath`] (what every hook does around the real call:
//!   reentrancy guard, event fields, stacks, hand-off; readable top-down).
//! - The tracer's life: [`tracer`] (lazy start on the first allocation call, the channel, the
//!   writer thread, exit, fork, fatal signals through [`crash`]), [`writer`] (interns stacks,
//!   keeps the module map, encodes records with the format crate, writes the file).
//! - Capture: [`python`] (the calling thread's CPython frames, read from interpreter memory
//!   without the GIL), [`unwind`] and [`fastunwind`] (native return addresses).
//! - Data and small services, depending on nothing above: [`table`] (the one declarative list of
//!   hooked functions, and their real functions), [`record`] (what the hooks hand to the writer),
//!   [`clock`] (time, call order, tracer starts), [`thread`] (thread id and name), [`config`]
//!   (every environment variable), [`resolve`], [`modules`], [`phdr`] (the one walk over the
//!   loaded objects), [`lazy`] (the one slot type for a function found on first use), [`guard`],
//!   [`output`], [`cuda`].
//!
//! `unsafe` lives in the FFI-facing modules, each use with a `// SAFETY:` note.

mod clock;
mod config;
mod crash;
mod exec;
mod exits;
#[cfg(target_arch = "x86_64")]
mod fastunwind;
mod cuda;
mod guard;
mod hooks;
mod hotpath;
mod lazy;
mod modules;
mod nvtx;
mod output;
mod phdr;
mod phases;
mod python;
mod record;
mod resolve;
mod ring;
mod routing;
mod table;
mod thread;
mod tracer;
mod unwind;
mod writer;

pub use gpumemtrace_format as format;

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    /// Each module of src/ (file stem) and the modules of this crate it names (`crate::x`,
    /// `use crate::{x, y::z}`), comments left out.
    fn dependencies() -> BTreeMap<String, Vec<String>> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let files: BTreeMap<String, String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "rs") && p.file_name().is_some_and(|n| n != "lib.rs"))
            .map(|p| (p.file_stem().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(&p).unwrap()))
            .collect();
        let ident = |s: &str| s.trim().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
        let mut deps = BTreeMap::new();
        for (name, text) in &files {
            let code: String = text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
            let mut found = Vec::new();
            for (i, _) in code.match_indices("crate::") {
                let rest = &code[i + "crate::".len()..];
                if let Some(group) = rest.strip_prefix('{') {
                    // `use crate::{a, b::{c, d}, e}`: the first name of each top-level item.
                    let (mut depth, mut start) = (0, 0);
                    for (j, c) in group.char_indices() {
                        match c {
                            '{' => depth += 1,
                            '}' if depth == 0 => {
                                found.push(ident(&group[start..j]));
                                break;
                            }
                            '}' => depth -= 1,
                            ',' if depth == 0 => {
                                found.push(ident(&group[start..j]));
                                start = j + 1;
                            }
                            _ => {}
                        }
                    }
                } else {
                    found.push(ident(rest));
                }
            }
            found.retain(|d| d != name && files.contains_key(d));
            found.sort();
            found.dedup();
            deps.insert(name.clone(), found);
        }
        deps
    }

    /// The modules' dependencies point one way: no cycle, of any length (issue 15).
    #[test]
    fn module_dependencies_have_no_cycle() {
        let deps = dependencies();
        assert!(deps.len() > 10 && deps["hotpath"].contains(&"tracer".to_owned()), "{deps:?}");
        // Depth-first search; `path` is the chain being explored.
        fn visit<'a>(m: &'a str, deps: &'a BTreeMap<String, Vec<String>>, path: &mut Vec<&'a str>, done: &mut Vec<&'a str>) {
            if done.contains(&m) {
                return;
            }
            if let Some(i) = path.iter().position(|&p| p == m) {
                panic!("module dependency cycle: {} -> {m}\nall: {deps:#?}", path[i..].join(" -> "));
            }
            path.push(m);
            for d in &deps[m] {
                visit(d, deps, path, done);
            }
            path.pop();
            done.push(m);
        }
        let mut done = Vec::new();
        for m in deps.keys() {
            visit(m, &deps, &mut Vec::new(), &mut done);
        }
    }

    /// One walk over the loaded objects and one kind of lazily found function (issue 15): the
    /// loader is asked in `phdr` only, and real functions are kept in `lazy::LazyFn` slots only.
    #[test]
    fn one_loader_walk_and_one_lazy_function_slot() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
            if stem == "lib" {
                continue; // this test
            }
            let code: String = std::fs::read_to_string(&p)
                .unwrap()
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            if stem != "phdr" {
                assert!(!code.contains("libc::dl_iterate_phdr("), "{stem} walks the loaded objects itself: use phdr::each_loaded");
            }
            if stem != "lazy" {
                assert!(!code.contains("AtomicPtr<c_void>"), "{stem} keeps a function pointer itself: use lazy::LazyFn");
            }
        }
    }

    /// The bottom layer: plain data and small services that every other module may use.
    #[test]
    fn bottom_modules_depend_on_nothing() {
        let deps = dependencies();
        for m in ["record", "clock", "thread", "config", "crash", "guard", "cuda", "output", "phdr", "lazy"] {
            assert!(deps[m].is_empty(), "{m} depends on {:?}", deps[m]);
        }
        assert_eq!(deps["modules"], ["phdr"]);
        assert_eq!(deps["table"], ["lazy", "resolve"], "the hook table is data (and the real functions' slots)");
        assert!(!deps["hotpath"].contains(&"table".to_owned()) && !deps["table"].contains(&"routing".to_owned()));
    }

    #[test]
    fn no_source_file_is_over_800_lines() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let n = std::fs::read_to_string(&p).map(|s| s.lines().count()).unwrap_or(0);
            assert!(n <= 800, "{} has {n} lines: split it (see docs/architecture.md)", p.display());
        }
    }
}
