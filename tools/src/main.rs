//! `gpumemtrace`: summarizes traces written by the libgpumemtrace.so preload library, and
//! runs programs under it.

mod cli;
mod error;
mod model;
mod read;
mod report;
mod symbolize;
mod units;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::args::Cli::parse();
    match cli::dispatch::run(cli.command) {
        Ok(status) => ExitCode::from(status),
        Err(e) => ExitCode::from(e.report()),
    }
}

/// The rules of docs/architecture.md, checked: dependencies point one way, down the layers, and
/// no file is over 800 lines (issue 15).
#[cfg(test)]
mod architecture {
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};

    /// Every .rs file under src/, by module path (`report::summary::build`; `mod.rs` is its
    /// folder's module; main.rs, the root, is left out).
    fn modules() -> BTreeMap<String, (PathBuf, String)> {
        fn walk(dir: &Path, prefix: &str, out: &mut BTreeMap<String, (PathBuf, String)>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                let name = p.file_stem().unwrap().to_string_lossy().into_owned();
                let path = if prefix.is_empty() { name.clone() } else { format!("{prefix}::{name}") };
                if p.is_dir() {
                    walk(&p, &path, out);
                } else if p.extension().is_some_and(|e| e == "rs") && !(prefix.is_empty() && name == "main") {
                    let module = if name == "mod" { prefix.to_string() } else { path };
                    out.insert(module, (p.clone(), std::fs::read_to_string(&p).unwrap()));
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), "", &mut out);
        out
    }

    /// The code of a file without comments and without its test module (a `tests.rs` file is all
    /// test code): tests may reach anywhere.
    fn code(module: &str, text: &str) -> String {
        if module == "tests" || module.ends_with("::tests") {
            return String::new();
        }
        // An inline test module (`#[cfg(test)] mod tests {`, `pub(crate) mod tests {`) ends the file.
        let inline_tests = text.match_indices("#[cfg(test)]").map(|(i, _)| i).find(|&i| {
            let next = text[i + "#[cfg(test)]".len()..].trim_start();
            let next = next.strip_prefix("pub(crate) ").or_else(|| next.strip_prefix("pub ")).unwrap_or(next);
            next.starts_with("mod tests {")
        });
        let text = &text[..inline_tests.unwrap_or(text.len())];
        text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
    }

    /// The paths a piece of code names after `prefix` (`crate::`, `super::`): `a::b::c`, and
    /// each item of a `{a, b::c}` group.
    fn paths_after(code: &str, prefix: &str) -> Vec<String> {
        let seg = |s: &str| -> String {
            s.trim().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':').collect()
        };
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
                let group = group.split('}').next().unwrap_or("");
                for item in group.split(',') {
                    out.push(format!("{base}{head}{}", seg(item)));
                }
            } else {
                out.push(format!("{base}{}", head.trim_end_matches(':')));
            }
        }
        out
    }

    /// Each module and the modules it uses: a path resolves to the longest module it starts
    /// with; `mod.rs` files depend on the children they re-export (`pub use child::...`).
    fn dependencies() -> BTreeMap<String, Vec<String>> {
        let mods = modules();
        let resolve = |path: &str| -> Option<String> {
            let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
            (1..=parts.len()).rev().map(|n| parts[..n].join("::")).find(|m| mods.contains_key(m))
        };
        let mut deps = BTreeMap::new();
        for (module, (file, text)) in &mods {
            let code = code(module, text);
            let is_mod_rs = file.file_name().is_some_and(|n| n == "mod.rs");
            // The module `super::` names: the parent of this one (of a folder's, for mod.rs).
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
            if is_mod_rs {
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

    #[test]
    fn module_dependencies_have_no_cycle() {
        let deps = dependencies();
        assert!(deps["model::load"].contains(&"read::replay".to_owned()), "{deps:#?}");
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

    /// The folders are the layers, and each uses only those below it: reading and replay, the
    /// model, symbolization, reports, the command line; `units` and `error` beneath them all.
    #[test]
    fn layers_depend_only_on_layers_below() {
        let rank = |m: &str| match m.split("::").next().unwrap() {
            "units" | "error" => 0,
            "read" => 1,
            "model" => 2,
            "symbolize" => 3,
            "report" => 4,
            "cli" => 5,
            other => panic!("{other}: a top-level module outside the layers (see docs/architecture.md)"),
        };
        for (m, ds) in dependencies() {
            for d in ds {
                let (a, b) = (m.split("::").next().unwrap(), d.split("::").next().unwrap());
                assert!(a == b || rank(&d) < rank(&m), "{m} uses {d}, which is not in a layer below it");
            }
        }
    }

    /// A folder's mod.rs only declares and re-exports: its code lives in the files beside it.
    #[test]
    fn mod_rs_files_only_declare() {
        for (module, (file, text)) in modules() {
            if file.file_name().is_none_or(|n| n != "mod.rs") {
                continue;
            }
            let code = code(&module, text.as_str());
            let mut in_use = false;
            for line in code.lines().map(str::trim).filter(|l| !l.is_empty()) {
                let ok = in_use
                    || ["mod ", "pub mod ", "pub(crate) mod ", "pub use ", "#[cfg(test)]"].iter().any(|p| line.starts_with(p));
                assert!(ok, "{}: {line:?}: code belongs in a file of its own", file.display());
                in_use = (line.starts_with("pub use ") || in_use) && !line.ends_with(';');
            }
        }
    }

    #[test]
    fn no_source_file_is_over_800_lines() {
        for (_, (file, text)) in modules() {
            let n = text.lines().count();
            assert!(n <= 800, "{} has {n} lines: split it (see docs/architecture.md)", file.display());
        }
    }
}
