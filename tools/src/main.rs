//! `gpumemtrace`: summarizes traces written by the libgpumemtrace.so preload library, and
//! runs programs under it (the commands are in the library, `lib.rs`).

fn main() -> std::process::ExitCode {
    gpumemtrace_cli::main()
}
