//! `gpumemtrace run` finds the preload library in each place an install puts it, with the real
//! CLI copied into those layouts: next to the executable (a build's target/ directory), the
//! Python wheel's `<prefix>/bin` + `<prefix>/lib/gpumemtrace/`, and `GPUMEMTRACE_LIB`. The
//! copy embedded by release builds (`cargo install`) is tested by tests/install.sh in CI, which
//! really builds the wheel and installs with cargo.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

/// `src` at `dst`: a hard link where it can be (the debug CLI is large), else a copy.
fn place(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
    if std::fs::hard_link(src, dst).is_err() {
        std::fs::copy(src, dst).unwrap();
    }
}

/// `exe run --output DIR -- <the emulated demo>`, without GPUMEMTRACE_LIB unless given.
fn run_demo(exe: &Path, lib_env: Option<&Path>, out: &Path) -> Output {
    let mut cmd = Command::new(exe);
    cmd.args(["run", "--output"]).arg(out).arg("--").arg(emu().join("demo"));
    cmd.env_remove("GPUMEMTRACE_LIB");
    if let Some(l) = lib_env {
        cmd.env("GPUMEMTRACE_LIB", l);
    }
    cmd.output().unwrap()
}

fn assert_traced(o: &Output, what: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{what}: {err}");
    assert!(
        err.contains("live at end (leaked) 20.0 MiB in 5 allocations") && err.contains("cache_batch demo.c:59"),
        "{what}: the demo was not traced:\n{err}"
    );
}

#[test]
fn run_finds_the_library_in_each_installed_layout() {
    let root = scratch("install-layouts");
    let (cli, shim) = (cli(), shim());

    // The wheel: <venv>/bin/gpumemtrace and <venv>/lib/gpumemtrace/libgpumemtrace.so.
    let venv = root.join("venv");
    let exe = venv.join("bin/gpumemtrace");
    place(&cli, &exe);
    place(&shim, &venv.join("lib/gpumemtrace/libgpumemtrace.so"));
    assert_traced(&run_demo(&exe, None, &root.join("t-wheel")), "wheel layout");

    // Next to the executable.
    let flat = root.join("flat");
    let exe = flat.join("gpumemtrace");
    place(&cli, &exe);
    place(&shim, &flat.join("libgpumemtrace.so"));
    assert_traced(&run_demo(&exe, None, &root.join("t-flat")), "next to the executable");

    // Alone: GPUMEMTRACE_LIB names it; without it, a clear error naming both places (the
    // debug CLI embeds no copy).
    let alone = root.join("alone/bin/gpumemtrace");
    place(&cli, &alone);
    assert_traced(&run_demo(&alone, Some(&shim), &root.join("t-env")), "GPUMEMTRACE_LIB");
    let o = run_demo(&alone, None, &root.join("t-none"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let dir = root.join("alone/bin");
    for p in [dir.join("libgpumemtrace.so"), dir.join("../lib/gpumemtrace/libgpumemtrace.so")] {
        assert!(err.contains(&p.display().to_string()), "{err}");
    }
    assert!(err.contains("GPUMEMTRACE_LIB"), "{err}");

    // A symbolic link to the installed CLI (~/bin/gpumemtrace -> <venv>/bin/gpumemtrace) finds
    // the library of the install it points into.
    let link: PathBuf = root.join("elsewhere/gpumemtrace");
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(venv.join("bin/gpumemtrace"), &link).unwrap();
    assert_traced(&run_demo(&link, None, &root.join("t-link")), "symbolic link to the wheel's CLI");
    let _ = std::fs::remove_dir_all(&root);
}
