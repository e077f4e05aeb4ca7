//! The records of a trace file, one after the other, and how reading ended.

use std::io::Read;
use std::ops::ControlFlow;

use gpumemtrace_format::recover::{Recovering, Recovery};
use gpumemtrace_format::{ReadError, Reader, Record};

/// How far reading got.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Outcome {
    /// The reader reached a clean end of file.
    #[default]
    Complete,
    /// The file ends inside the record starting at `offset`.
    Truncated { offset: u64 },
    /// The record starting at `offset` is malformed.
    Corrupt { offset: u64, message: String },
}

/// Feeds every record to `f` until it breaks or the file ends; returns how reading ended.
/// Only a file that is not a trace at all, or an I/O error, is an `Err`.
/// A journal's `recovery` adds, after the trace's own records, those the trace lacks.
pub fn for_each_record<R: Read>(
    source: R,
    recovery: Option<Recovery>,
    mut f: impl FnMut(Record) -> ControlFlow<()>,
) -> Result<Outcome, String> {
    let mut reader = match Reader::new(source) {
        Ok(r) => Recovering::new(r, recovery),
        Err(e) => return outcome_of(e),
    };
    loop {
        match reader.next_record() {
            Ok(Some(rec)) => {
                if f(rec).is_break() {
                    return Ok(Outcome::Complete);
                }
            }
            Ok(None) => return Ok(Outcome::Complete),
            Err(e) => return outcome_of(e),
        }
    }
}

fn outcome_of(e: ReadError) -> Result<Outcome, String> {
    match e {
        ReadError::Truncated { offset } => Ok(Outcome::Truncated { offset }),
        ReadError::Corrupt { offset, what } => Ok(Outcome::Corrupt { offset, message: what }),
        e @ (ReadError::BadHeader(_) | ReadError::Io(_)) => Err(e.to_string()),
    }
}
