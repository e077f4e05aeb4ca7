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

/// Records handed from the reading thread to the model at a time.
const BATCH: usize = 4096;
/// Batches in flight: the reader runs at most this far ahead (memory stays bounded).
const AHEAD: usize = 4;

/// Feeds every record to `f` until it breaks or the file ends; returns how reading ended.
/// Only a file that is not a trace at all, or an I/O error, is an `Err`.
/// A journal's `recovery` adds, after the trace's own records, those the trace lacks.
/// `damaged` gets the compressed frames that were left out as damaged, reading going on after
/// them (see the format crate's `compress`): each the byte it started at and why.
///
/// Reading and decoding run on a thread of their own, a few batches ahead of `f` (a quarter of
/// the time of a summary went to decoding): the records reach `f` in file order, as before.
pub fn for_each_record<R: Read + Send>(
    source: R,
    recovery: Option<Recovery>,
    damaged: &mut Vec<(u64, String)>,
    mut f: impl FnMut(Record) -> ControlFlow<()>,
) -> Result<Outcome, String> {
    let (full_tx, full_rx) = crossbeam_channel::bounded::<Vec<Record>>(AHEAD);
    // Emptied batches go back to the reader, so the steady state allocates no batch.
    let (empty_tx, empty_rx) = crossbeam_channel::bounded::<Vec<Record>>(AHEAD);
    std::thread::scope(|scope| {
        let reading = scope.spawn(move || {
            let mut reader = match Reader::new(source) {
                Ok(r) => Recovering::new(r, recovery),
                Err(e) => return (outcome_of(e), Vec::new()),
            };
            let mut batch = Vec::with_capacity(BATCH);
            let end = loop {
                match reader.next_record() {
                    Ok(Some(rec)) => {
                        batch.push(rec);
                        if batch.len() == BATCH {
                            let next = empty_rx.try_recv().unwrap_or_else(|_| Vec::with_capacity(BATCH));
                            if full_tx.send(std::mem::replace(&mut batch, next)).is_err() {
                                return (Ok(Outcome::Complete), reader.damaged().to_vec()); // `f` stopped early
                            }
                        }
                    }
                    Ok(None) => break Ok(Outcome::Complete),
                    Err(e) => break outcome_of(e),
                }
            };
            // What was read before the end (or the damage) is delivered first.
            let _ = full_tx.send(batch);
            (end, reader.damaged().to_vec())
        });
        let mut stopped = false;
        while let Ok(mut batch) = full_rx.recv() {
            for rec in batch.drain(..) {
                if f(rec).is_break() {
                    stopped = true;
                    break;
                }
            }
            if stopped {
                break;
            }
            let _ = empty_tx.try_send(batch);
        }
        // Stopped early: the reader's next send fails and it ends.
        drop(full_rx);
        let (end, lost) = reading.join().unwrap_or_else(|_| (Err("the trace reader failed".to_string()), Vec::new()));
        *damaged = lost;
        if stopped {
            Ok(Outcome::Complete)
        } else {
            end
        }
    })
}

fn outcome_of(e: ReadError) -> Result<Outcome, String> {
    match e {
        ReadError::Truncated { offset } => Ok(Outcome::Truncated { offset }),
        ReadError::Corrupt { offset, what } => Ok(Outcome::Corrupt { offset, message: what }),
        e @ (ReadError::BadHeader(_) | ReadError::Io(_)) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumemtrace_format::{header, Encoder, Event};

    /// A trace of `n` events numbered by their time, encoded as the tracer writes them.
    fn trace(n: u64) -> Vec<u8> {
        let mut out = header().to_vec();
        let mut enc = Encoder::new();
        for i in 0..n {
            enc.encode(&Record::Event(Event { time_ns: i, tid: 1, addr: 0x1000 + i, size: 8, ..Event::default() }), &mut out);
        }
        out
    }

    fn times(bytes: &[u8], stop_after: Option<usize>) -> (Vec<u64>, Outcome) {
        let mut seen = Vec::new();
        let outcome = for_each_record(bytes, None, &mut Vec::new(), |r| {
            if let Record::Event(e) = r {
                seen.push(e.time_ns);
            }
            if stop_after.is_some_and(|n| seen.len() == n) {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
        (seen, outcome)
    }

    #[test]
    fn records_arrive_in_file_order_across_batches() {
        let n = 3 * BATCH as u64 + 17;
        let (seen, outcome) = times(&trace(n), None);
        assert_eq!(seen, (0..n).collect::<Vec<_>>());
        assert_eq!(outcome, Outcome::Complete);
    }

    #[test]
    fn a_cut_trace_delivers_every_record_before_the_cut_then_says_where_it_ends() {
        let n = 2 * BATCH as u64 + 5;
        let whole = trace(n);
        let cut = &whole[..whole.len() - 3];
        let (seen, outcome) = times(cut, None);
        assert_eq!(seen, (0..n - 1).collect::<Vec<_>>(), "all but the cut record, in order");
        assert!(matches!(outcome, Outcome::Truncated { .. }), "{outcome:?}");
    }

    #[test]
    fn stopping_early_ends_the_reader_too() {
        let n = AHEAD as u64 * BATCH as u64 * 4;
        let (seen, outcome) = times(&trace(n), Some(BATCH + 3));
        assert_eq!(seen, (0..BATCH as u64 + 3).collect::<Vec<_>>());
        assert_eq!(outcome, Outcome::Complete);
    }

    #[test]
    fn a_file_that_is_not_a_trace_is_an_error() {
        assert!(for_each_record(&b"not a trace at all, not even its header"[..], None, &mut Vec::new(), |_| ControlFlow::Continue(())).is_err());
    }
}
