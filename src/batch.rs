//! What one write puts in the trace: records (encoded already, or events still to encode), where
//! each ring will stand once they are written, and how many events the trace then holds.
//!
//! Inline, the writer encodes as it goes. Once the writing end is on a thread of its own (see
//! `sink`), the writer leaves the events as they are and that thread encodes them, beside its
//! compression: encoding was about a fifth of the writer's instructions an event, and with many
//! busy threads the writer is what limits. The records between events (stacks, modules, code
//! objects...) are rare and encoded by the writer, so each batch is one ordered list.

use gpumemtrace_format::{self as fmt, Encoder, EventState, Record};

use crate::ring::RINGS;

pub struct Batch {
    pub body: Body,
    pub at: [u64; RINGS],
    pub events: u64,
    /// The trace's last write (exit, a fatal signal): its compressed frame ends with it, so
    /// that a reader checks every record (see the format crate's `compress`).
    pub last: bool,
    /// Where the event deltas stand at the body's start: a compressed frame that starts with
    /// this batch begins with it (a Sync record), so a reader goes on past a damaged frame.
    pub start: EventState,
}

pub enum Body {
    /// Encoded records.
    Bytes(Vec<u8>),
    /// Records in order: events to encode, and the others already encoded (`Items::side`).
    Items(Items),
}

#[derive(Default)]
pub struct Items {
    list: Vec<Item>,
    /// The encoded records between events, one after the other.
    side: Vec<u8>,
    /// The event deltas where this batch starts: after the last event of the previous one.
    start: EventState,
}

enum Item {
    Event(fmt::Event),
    /// The next encoded record of `side`, which ends there.
    Encoded(usize),
}

/// A batch this large is written without waiting for the flush interval (and says the event
/// rate is high).
pub const BATCH_BYTES: usize = 256 * 1024;

/// A batch of items this long is too (about 200 KiB once encoded).
const BATCH_EVENTS: usize = 8192;

impl Body {
    /// An empty body of the same kind, keeping the buffers' capacity.
    pub fn emptied(mut self) -> Body {
        match &mut self {
            Body::Bytes(b) => b.clear(),
            Body::Items(it) => {
                it.list.clear();
                it.side.clear();
            }
        }
        self
    }

    pub fn is_empty(&self) -> bool {
        match self {
            Body::Bytes(b) => b.is_empty(),
            Body::Items(it) => it.list.is_empty(),
        }
    }

    /// Large enough to be written before the flush interval is up.
    pub fn is_full(&self) -> bool {
        match self {
            Body::Bytes(b) => b.len() >= BATCH_BYTES,
            Body::Items(it) => it.list.len() >= BATCH_EVENTS || it.side.len() >= BATCH_BYTES,
        }
    }

    /// Appends a record (an event goes through `put_event`), encoded with `enc` unless it is an
    /// event left for the writing end.
    pub fn put(&mut self, enc: &mut Encoder, rec: &Record) {
        match self {
            Body::Bytes(b) => enc.encode(rec, b),
            Body::Items(it) => match rec {
                Record::Event(e) => self.put_event(enc, *e),
                _ => {
                    enc.encode(rec, &mut it.side);
                    it.list.push(Item::Encoded(it.side.len()));
                }
            },
        }
    }

    /// Appends an event: encoded with `enc` now, or left for `encode` on the writing end. Either
    /// way `enc`'s event state moves past it, so it always says where the stream stands (where
    /// the next body starts, and where the writer goes on should it encode again).
    pub fn put_event(&mut self, enc: &mut Encoder, e: fmt::Event) {
        match self {
            Body::Bytes(b) => enc.encode_event(&e, b),
            Body::Items(it) => {
                it.list.push(Item::Event(e));
                enc.set_event_state(EventState::after(&e));
            }
        }
    }

    /// Marks where an items body starts in the event stream: `state`, after the last event
    /// before it (a bytes body needs nothing: its encoder is the writer's own).
    pub fn start_items(&mut self, state: EventState) {
        if let Body::Items(it) = self {
            it.start = state;
        }
    }
}

impl Items {
    /// Encodes the batch into `out` (cleared first), going on with `enc` from where the batch
    /// starts: the same bytes the writer would have written inline.
    pub fn encode(&self, enc: &mut Encoder, out: &mut Vec<u8>) {
        out.clear();
        enc.set_event_state(self.start);
        let mut from = 0;
        for item in &self.list {
            match item {
                Item::Event(e) => enc.encode_event(e, out),
                Item::Encoded(end) => {
                    out.extend_from_slice(&self.side[from..*end]);
                    from = *end;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(i: u64) -> fmt::Event {
        fmt::Event {
            api: 1 + (i % 3) as u32,
            time_ns: 1_000 + 37 * i,
            tid: 7 + (i % 2) as u32,
            stack: (i % 5) as u32,
            addr: 0x7f00_0000 + 4096 * (i % 11),
            size: 512 * i,
            ..Default::default()
        }
    }

    /// Events left for the writing end's thread, in batches, encode to the very bytes the writer
    /// writes inline, records between them included, across the switch from one to the other.
    #[test]
    fn events_encoded_beside_the_writer_are_the_bytes_it_writes_inline() {
        let records: Vec<Record> = (0..100u64)
            .map(|i| if i % 10 == 3 { Record::Stack(fmt::Stack { id: i as u32, frames: vec![0x400000 + i, 0x400100] }) } else { Record::Event(event(i)) })
            .collect();
        let mut inline = Vec::new();
        let mut enc = Encoder::new();
        for r in &records {
            enc.encode(r, &mut inline);
        }

        // The writer: inline for the first 30 records, then items in batches of 25, each encoded
        // by the other end's own encoder, then inline again from record 80 (as after a failed
        // write): its encoder must have kept track of the events it left to the other end.
        let (mut writer_enc, mut beside_enc) = (Encoder::new(), Encoder::new());
        let (mut out, mut encoded) = (Vec::new(), Vec::new());
        let mut body = Body::Bytes(Vec::new());
        let mut hand_over = |body: Body, out: &mut Vec<u8>| match body {
            Body::Bytes(b) => out.extend_from_slice(&b),
            Body::Items(it) => {
                it.encode(&mut beside_enc, &mut encoded);
                out.extend_from_slice(&encoded);
            }
        };
        for (n, r) in records.iter().enumerate() {
            if n == 30 || n == 55 || n == 80 {
                let next = if n == 80 { Body::Bytes(Vec::new()) } else { Body::Items(Items::default()) };
                hand_over(std::mem::replace(&mut body, next), &mut out);
                body.start_items(writer_enc.event_state());
            }
            body.put(&mut writer_enc, r);
        }
        hand_over(body, &mut out);
        assert_eq!(out, inline);
    }
}
