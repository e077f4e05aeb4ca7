//! The command line: its arguments (`args`), the one dispatch from them to a report
//! (`dispatch`), and `gpumemtrace run` (`run`), which launches a program traced.

pub mod args;
pub mod dispatch;
pub mod run;
pub mod shim;
