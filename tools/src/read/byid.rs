//! Values by a record's small number (API ids: a few dozen, numbered from 0): looked up at every
//! event, so kept in a vector by id; an id past `DENSE` (a damaged or odd trace) goes to a map,
//! so a large id costs no memory.

use rustc_hash::FxHashMap;

const DENSE: u32 = 4096;

pub struct ById<T> {
    dense: Vec<Option<T>>,
    sparse: FxHashMap<u32, T>,
}

impl<T> Default for ById<T> {
    fn default() -> Self {
        ById { dense: Vec::new(), sparse: FxHashMap::default() }
    }
}

impl<T> ById<T> {
    pub fn insert(&mut self, id: u32, v: T) {
        if id < DENSE {
            let i = id as usize;
            if self.dense.len() <= i {
                self.dense.resize_with(i + 1, || None);
            }
            self.dense[i] = Some(v);
        } else {
            self.sparse.insert(id, v);
        }
    }

    #[inline]
    pub fn get(&self, id: u32) -> Option<&T> {
        if id < DENSE {
            self.dense.get(id as usize).and_then(Option::as_ref)
        } else {
            self.sparse.get(&id)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_large_ids_are_found_and_replaced() {
        let mut m = ById::default();
        assert_eq!(m.get(0), None);
        for id in [3, 0, DENSE - 1, DENSE, u32::MAX] {
            m.insert(id, id as u64);
        }
        m.insert(3, 33);
        assert_eq!(m.get(3), Some(&33));
        for id in [0, DENSE - 1, DENSE, u32::MAX] {
            assert_eq!(m.get(id), Some(&(id as u64)), "{id}");
        }
        assert_eq!(m.get(1), None);
        assert_eq!(m.get(DENSE + 1), None);
        assert!(m.dense.len() <= DENSE as usize);
    }
}
