//! The rules of docs/architecture.md, checked on the source of all three crates (issue 15):
//! module dependencies point one way (no cycle, of any length), each crate's layers use only
//! the layers below them, and no source file is over 800 lines.
//!
//! A module's dependencies are the modules of its own crate that its code names (`crate::a::b`,
//! `use crate::{a, b::c}`, `super::x`), comments and test modules left out: tests may reach
//! anywhere.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

struct Crate {
    /// Module path (`report::summary::build`; a folder's `mod.rs` is the folder's module) to its
    /// file and text. The crate root (lib.rs, main.rs) is left out.
    modules: BTreeMap<String, (PathBuf, String)>,
}

impl Crate {
    fn read(src: &str) -> Crate {
        fn walk(dir: &Path, prefix: &str, out: &mut BTreeMap<String, (PathBuf, String)>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                let name = p.file_stem().unwrap().to_string_lossy().into_owned();
                let path = if prefix.is_empty() { name.clone() } else { format!("{prefix}::{name}") };
                if p.is_dir() {
                    walk(&p, &path, out);
                } else if p.extension().is_some_and(|e| e == "rs") && !(prefix.is_empty() && (name == "main" || name == "lib")) {
                    let module = if name == "mod" { prefix.to_string() } else { path };
                    out.insert(module, (p.clone(), std::fs::read_to_string(&p).unwrap()));
                }
            }
        }
        let mut modules = BTreeMap::new();
        walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join(src), "", &mut modules);
        assert!(modules.len() > 5, "{src}: no modules found");
        Crate { modules }
    }

    /// Each module and the modules of the crate it uses: a path resolves to the longest module
    /// it starts with; a `mod.rs` depends on the children it re-exports (`pub use child::...`).
    fn dependencies(&self) -> BTreeMap<String, Vec<String>> {
        let resolve = |path: &str| -> Option<String> {
            let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
            (1..=parts.len()).rev().map(|n| parts[..n].join("::")).find(|m| self.modules.contains_key(m))
        };
        let mut deps = BTreeMap::new();
        for (module, (file, text)) in &self.modules {
            let code = code(module, text);
            let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
            let mut found: Vec<String> = paths_after(&code, "crate::").iter().filter_map(|p| resolve(p)).collect();
            for p in paths_after(&code, "super::") {
                let mut base: Vec<&str> = parent.split("::").filter(|s| !s.is_empty()).collect();
                let mut rest = p.as_str();
                while let Some(r) = rest.strip_prefix("super::") {
                    base.pop();
                    rest = r;
                }
                let full = if base.is_empty() { rest.to_string() } else { format!("{}::{rest}", base.join("::")) };
                found.extend(resolve(&full));
            }
            if file.file_name().is_some_and(|n| n == "mod.rs") {
                for line in code.lines() {
                    if let Some(child) = line.trim().strip_prefix("pub use ").and_then(|r| r.split("::").next()) {
                        found.extend(resolve(&format!("{module}::{child}")));
                    }
                }
            }
            found.retain(|d| d != module);
            found.sort();
            found.dedup();
            deps.insert(module.clone(), found);
        }
        deps
    }
}

/// The code of a file without comments and without its test module (a `tests.rs` file is all
/// test code).
fn code(module: &str, text: &str) -> String {
    if module == "tests" || module.ends_with("::tests") {
        return String::new();
    }
    let inline_tests = text.match_indices("#[cfg(test)]").map(|(i, _)| i).find(|&i| {
        let next = text[i + "#[cfg(test)]".len()..].trim_start();
        let next = next.strip_prefix("pub(crate) ").or_else(|| next.strip_prefix("pub ")).unwrap_or(next);
        next.starts_with("mod tests {")
    });
    let text = &text[..inline_tests.unwrap_or(text.len())];
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The paths a piece of code names after `prefix` (`crate::`, `super::`): `a::b::c`, and each
/// item of a `{a, b::c}` group.
fn paths_after(code: &str, prefix: &str) -> Vec<String> {
    let seg =
        |s: &str| -> String { s.trim().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':').collect() };
    let mut out = Vec::new();
    for (i, _) in code.match_indices(prefix) {
        if i > 0 && code[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue; // `super::super::x` is read from its first `super::`
        }
        let mut rest = &code[i + prefix.len()..];
        let mut base = String::new();
        while let Some(r) = rest.strip_prefix("super::") {
            base.push_str("super::");
            rest = r;
        }
        let head = seg(rest);
        let after = &rest[head.len()..];
        if let Some(group) = after.strip_prefix('{').or_else(|| head.is_empty().then_some("").and(rest.strip_prefix('{'))) {
            for item in group.split('}').next().unwrap_or("").split(',') {
                out.push(format!("{base}{head}{}", seg(item)));
            }
        } else {
            out.push(format!("{base}{}", head.trim_end_matches(':')));
        }
    }
    out
}

fn assert_no_cycle(name: &str, deps: &BTreeMap<String, Vec<String>>) {
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
        visit(m, deps, &mut Vec::new(), &mut done);
    }
    assert_eq!(done.len(), deps.len(), "{name}");
}

const CRATES: [&str; 3] = ["src", "format/src", "tools/src"];

#[test]
fn no_crate_has_a_module_dependency_cycle() {
    for src in CRATES {
        let deps = Crate::read(src).dependencies();
        assert_no_cycle(src, &deps);
    }
    // The reading finds real dependencies (a reader that found none would pass the above).
    assert!(Crate::read("src").dependencies()["hotpath"].contains(&"tracer".to_owned()));
    assert!(Crate::read("tools/src").dependencies()["model::load"].contains(&"read::replay".to_owned()));
}

#[test]
fn no_source_file_is_over_800_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<PathBuf> = CRATES.iter().flat_map(|c| Crate::read(c).modules.into_values().map(|(p, _)| p)).collect();
    files.extend(["src/lib.rs", "format/src/lib.rs", "tools/src/main.rs"].map(|f| root.join(f)));
    for e in std::fs::read_dir(root.join("tests")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|e| e == "rs") {
            files.push(p);
        }
    }
    for p in files {
        let n = std::fs::read_to_string(&p).unwrap().lines().count();
        assert!(n <= 800, "{} has {n} lines: split it (see docs/architecture.md)", p.display());
    }
}

/// The shim's bottom layer: plain data and small services that every other module may use,
/// depending on nothing of the shim's own.
#[test]
fn the_shims_bottom_modules_depend_on_nothing() {
    let deps = Crate::read("src").dependencies();
    for m in ["record", "clock", "thread", "config", "crash", "cuda", "output", "phdr", "lazy", "pylayout", "stackkey", "prefetch", "pause"] {
        assert!(deps[m].is_empty(), "{m} depends on {:?}", deps[m]);
    }
    assert_eq!(deps["modules"], ["phdr"]);
    assert_eq!(deps["guard"], ["thread"], "the guard's depth lives in the thread's one thread-local");
    assert_eq!(deps["table"], ["lazy", "resolve"], "the hook table is data (and the real functions' slots)");
    assert!(!deps["hotpath"].contains(&"table".to_owned()) && !deps["table"].contains(&"routing".to_owned()));
}

/// One walk over the loaded objects and one kind of lazily found function in the shim: the
/// loader is asked in `phdr` only, and real functions are kept in `lazy::LazyFn` slots only.
#[test]
fn the_shim_has_one_loader_walk_and_one_lazy_function_slot() {
    for (module, (_, text)) in Crate::read("src").modules {
        let code = code(&module, &text);
        if module != "phdr" {
            assert!(!code.contains("dl_iterate_phdr("), "{module} walks the loaded objects itself: use phdr::each_loaded");
        }
        if module != "lazy" {
            assert!(!code.contains("AtomicPtr<c_void>"), "{module} keeps a function pointer itself: use lazy::LazyFn");
        }
    }
}

/// The format crate: header and records at the bottom, encode above them, decode above encode
/// and compress.
#[test]
fn the_formats_codec_is_layered() {
    let deps = Crate::read("format/src").dependencies();
    for m in ["header", "records", "compress"] {
        assert!(deps[m].is_empty(), "{m} depends on {:?}", deps[m]);
    }
    assert_eq!(deps["encode"], ["header", "records"]);
    assert_eq!(deps["decode"], ["compress", "encode", "header", "records"]);
}

/// The CLI's folders are its layers, and each uses only those below it: reading and replay, the
/// model, symbolization, reports, the command line; `units` and `error` beneath them all.
#[test]
fn the_clis_layers_depend_only_on_layers_below() {
    let rank = |m: &str| match m.split("::").next().unwrap() {
        "units" | "error" => 0,
        "read" => 1,
        "model" => 2,
        "symbolize" => 3,
        "report" => 4,
        "cli" => 5,
        other => panic!("{other}: a top-level module outside the layers (see docs/architecture.md)"),
    };
    for (m, ds) in Crate::read("tools/src").dependencies() {
        for d in ds {
            let (a, b) = (m.split("::").next().unwrap(), d.split("::").next().unwrap());
            assert!(a == b || rank(&d) < rank(&m), "{m} uses {d}, which is not in a layer below it");
        }
    }
}

/// A CLI folder's mod.rs only declares and re-exports: its code lives in the files beside it.
#[test]
fn the_clis_mod_rs_files_only_declare() {
    for (module, (file, text)) in Crate::read("tools/src").modules {
        if file.file_name().is_none_or(|n| n != "mod.rs") {
            continue;
        }
        let code = code(&module, &text);
        let mut in_use = false;
        for line in code.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let ok = in_use || ["mod ", "pub mod ", "pub(crate) mod ", "pub use ", "#[cfg(test)]"].iter().any(|p| line.starts_with(p));
            assert!(ok, "{}: {line:?}: code belongs in a file of its own", file.display());
            in_use = (line.starts_with("pub use ") || in_use) && !line.ends_with(';');
        }
    }
}
