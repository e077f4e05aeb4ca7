//! A small pickle writer (protocol 4) with a memo: every string, and every object the caller
//! marks as shared, is written once and referred to afterwards. A memory snapshot repeats the
//! same keys and stack frames in every entry; with the memo a million-entry snapshot stays tens
//! of megabytes instead of a gigabyte. Only opcodes that both Python's unpickler and
//! memory_viz's own JavaScript unpickler read are used; lists and dicts are appended in batches
//! of 1000, as Python does, so the JavaScript side never spreads a huge argument list.

use std::collections::HashMap;

const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const MARK: u8 = b'(';
const EMPTY_DICT: u8 = b'}';
const SETITEMS: u8 = b'u';
const EMPTY_LIST: u8 = b']';
const APPENDS: u8 = b'e';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const BININT: u8 = b'J';
const LONG1: u8 = 0x8a;
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE: u8 = b'X';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const MEMOIZE: u8 = 0x94;
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';

const BATCH: usize = 1000;

#[derive(Clone, PartialEq, Eq, Hash)]
enum Key {
    Str(String),
    Shared(u64),
}

pub struct Pickler {
    pub out: Vec<u8>,
    memo: HashMap<Key, u32>,
}

impl Default for Pickler {
    fn default() -> Self {
        Pickler { out: vec![PROTO, 4], memo: HashMap::new() }
    }
}

impl Pickler {
    /// The finished pickle.
    pub fn finish(mut self) -> Vec<u8> {
        self.out.push(STOP);
        self.out
    }

    /// Writes a reference to the memoized object `key` if there is one (true).
    fn get(&mut self, key: &Key) -> bool {
        let Some(&i) = self.memo.get(key) else { return false };
        match u8::try_from(i) {
            Ok(b) => self.out.extend_from_slice(&[BINGET, b]),
            Err(_) => {
                self.out.push(LONG_BINGET);
                self.out.extend_from_slice(&i.to_le_bytes());
            }
        }
        true
    }

    /// Memoizes the object on top of the unpickler's stack (MEMOIZE numbers them in order).
    fn put(&mut self, key: Key) {
        self.out.push(MEMOIZE);
        let i = self.memo.len() as u32;
        self.memo.insert(key, i);
    }

    pub fn str(&mut self, s: &str) {
        let key = Key::Str(s.to_owned());
        if self.get(&key) {
            return;
        }
        match u8::try_from(s.len()) {
            Ok(n) => self.out.extend_from_slice(&[SHORT_BINUNICODE, n]),
            Err(_) => {
                self.out.push(BINUNICODE);
                self.out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            }
        }
        self.out.extend_from_slice(s.as_bytes());
        self.put(key);
    }

    pub fn int(&mut self, v: u64) {
        if v < 0x100 {
            self.out.extend_from_slice(&[BININT1, v as u8]);
        } else if v < 0x1_0000 {
            self.out.push(BININT2);
            self.out.extend_from_slice(&(v as u16).to_le_bytes());
        } else if v < 0x8000_0000 {
            self.out.push(BININT);
            self.out.extend_from_slice(&(v as u32).to_le_bytes());
        } else {
            // Little-endian two's complement, as short as it goes, with a clear sign bit.
            let mut bytes = v.to_le_bytes().to_vec();
            while bytes.len() > 1 && bytes[bytes.len() - 1] == 0 && bytes[bytes.len() - 2] & 0x80 == 0 {
                bytes.pop();
            }
            if bytes[bytes.len() - 1] & 0x80 != 0 {
                bytes.push(0);
            }
            self.out.extend_from_slice(&[LONG1, bytes.len() as u8]);
            self.out.extend_from_slice(&bytes);
        }
    }

    pub fn bool(&mut self, v: bool) {
        self.out.push(if v { NEWTRUE } else { NEWFALSE });
    }

    /// A list of `items`, each written by `item`.
    pub fn list<T>(&mut self, items: &[T], mut item: impl FnMut(&mut Self, &T)) {
        self.out.push(EMPTY_LIST);
        for chunk in items.chunks(BATCH) {
            self.out.push(MARK);
            for x in chunk {
                item(self, x);
            }
            self.out.push(APPENDS);
        }
    }

    /// A dict of string keys; `items` writes its values through [`Dict::item`].
    pub fn dict(&mut self, items: impl FnOnce(&mut Dict)) {
        self.out.push(EMPTY_DICT);
        let mut d = Dict { p: self, n: 0 };
        items(&mut d);
        if d.n > 0 {
            d.p.out.push(SETITEMS);
        }
    }

    /// An object that many places share (the frames of one stack): written by `write` the
    /// first time, referred to by `id` afterwards. Only for objects no reader modifies.
    pub fn shared(&mut self, id: u64, write: impl FnOnce(&mut Self)) {
        let key = Key::Shared(id);
        if !self.get(&key) {
            write(self);
            self.put(key);
        }
    }
}

pub struct Dict<'a> {
    p: &'a mut Pickler,
    /// Items since the last MARK.
    n: usize,
}

impl Dict<'_> {
    pub fn item(&mut self, key: &str, value: impl FnOnce(&mut Pickler)) {
        if self.n == BATCH {
            self.p.out.push(SETITEMS);
            self.n = 0;
        }
        if self.n == 0 {
            self.p.out.push(MARK);
        }
        self.p.str(key);
        value(self.p);
        self.n += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcodes_of_a_small_object() {
        let mut p = Pickler::default();
        p.list(&[0u64, 300, 1 << 40], |p, &v| {
            p.dict(|d| {
                d.item("a", |p| p.int(v));
                d.item("s", |p| p.str("a"));
            })
        });
        let b = p.finish();
        let mut want = vec![PROTO, 4, EMPTY_LIST, MARK];
        // First dict: keys and the value "a" written once, then memo references.
        want.extend_from_slice(&[EMPTY_DICT, MARK, SHORT_BINUNICODE, 1, b'a', MEMOIZE, BININT1, 0]);
        want.extend_from_slice(&[SHORT_BINUNICODE, 1, b's', MEMOIZE, BINGET, 0, SETITEMS]);
        want.extend_from_slice(&[EMPTY_DICT, MARK, BINGET, 0, BININT2, 0x2c, 0x01, BINGET, 1, BINGET, 0, SETITEMS]);
        want.extend_from_slice(&[EMPTY_DICT, MARK, BINGET, 0, LONG1, 6, 0, 0, 0, 0, 0, 1, BINGET, 1, BINGET, 0, SETITEMS]);
        want.extend_from_slice(&[APPENDS, STOP]);
        assert_eq!(b, want);
    }

    #[test]
    fn large_ints_keep_a_clear_sign_bit_and_shared_objects_are_written_once() {
        let mut p = Pickler::default();
        p.int(0x8000_0000);
        p.int(u64::MAX);
        for _ in 0..2 {
            p.shared(7, |p| p.list(&[1u64], |p, &v| p.int(v)));
        }
        let b = p.finish();
        assert_eq!(&b[2..9], &[LONG1, 5, 0, 0, 0, 0x80, 0]);
        assert_eq!(&b[9..20], &[LONG1, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]);
        assert_eq!(&b[20..], &[EMPTY_LIST, MARK, BININT1, 1, APPENDS, MEMOIZE, BINGET, 0, STOP]);
    }
}
