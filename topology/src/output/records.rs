//! Record batches (internal): the tuples of one stream, emitted as the user's own `Serialize`
//! type with [`crate::BoltOutput::emit_record`] or [`crate::SpoutOutput::emit_record`], travel
//! as a `Vec` of that type, not as dynamic [`Values`](crate::Values). The stream metadata is
//! carried once per batch, and the anchors only when a record of the batch is tracked.
//!
//! A bolt that reads the same type ([`crate::Inputs::for_each_record`]) gets each record by
//! reference, with no per-tuple encoding, decoding, or dynamic value drop. Any other reader
//! (`execute`, [`crate::Inputs::for_each`], a window, the test harness) gets the records as
//! tuples, encoded on arrival with [`crate::typed::to_values`]: the two representations carry
//! the same values, so the choice is only about speed.

use std::any::Any;

use crate::tuple::{Anchors, StreamMeta, Tuple};
use crate::typed::TypedError;

/// A type that can be emitted as a record: any `Serialize` type that can be shared between tasks.
/// Its fields, in declaration order, are the stream's fields (see [`crate::typed`]).
pub trait Record: serde::Serialize + Send + Sync + 'static {}

impl<T: serde::Serialize + Send + Sync + 'static> Record for T {}

/// A `Records<T>` of some record type, to be downcast by code that knows `T`.
pub(crate) type AnyRecords = Box<dyn Any + Send + Sync>;

/// A type-erased batch of records of one stream, sent to one task.
pub(crate) trait RecordBuf: Send + Sync {
    /// Records in the batch.
    fn len(&self) -> usize;
    /// For the typed reader's downcast.
    fn as_any(&self) -> &dyn Any;
    /// The records from `start` on, as tuples; a record that does not encode into the stream's
    /// fields is returned with its anchors and the reason instead (it cannot be delivered as a
    /// tuple).
    fn to_tuples(&self, start: usize) -> (Vec<Option<Tuple>>, Vec<(Anchors, String)>);
    /// The batch emptied, for reuse by the senders (see `BatchPool`); `None` when it grew past
    /// twice `batch_size`.
    fn recycle(self: Box<Self>, batch_size: usize) -> Option<AnyRecords>;
}

impl std::fmt::Debug for dyn RecordBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RecordBuf({} records)", self.len())
    }
}

/// The records of one batch, their stream, and their anchors.
pub(crate) struct Records<T> {
    pub(crate) meta: &'static StreamMeta,
    pub(crate) items: Vec<T>,
    /// Anchors by position; shorter than `items` (empty while every record is untracked): a
    /// record past the end is untracked.
    pub(crate) anchors: Vec<Anchors>,
}

impl<T> Records<T> {
    pub(crate) fn new(meta: &'static StreamMeta, capacity: usize) -> Self {
        Records { meta, items: Vec::with_capacity(capacity), anchors: Vec::new() }
    }

    #[inline(always)]
    pub(crate) fn push(&mut self, item: T, anchors: Anchors) {
        if !anchors.is_empty() || !self.anchors.is_empty() {
            if self.anchors.len() == self.items.len() {
                if self.anchors.len() == self.anchors.capacity() {
                    self.anchors.reserve(self.items.capacity().max(1));
                }
                self.anchors.push(anchors);
            } else {
                self.push_anchors(anchors);
            }
        }
        // a batch is created with room for a full batch (it is sent when full): the record is
        // then moved in place, with the growth path out of line
        if self.items.len() == self.items.capacity() {
            self.items.reserve(1);
        }
        self.items.push(item);
    }

    /// The first tracked record after untracked ones: the column is filled up to it.
    #[cold]
    #[inline(never)]
    fn push_anchors(&mut self, anchors: Anchors) {
        self.anchors.resize_with(self.items.len(), Anchors::new);
        self.anchors.push(anchors);
    }

    /// The anchors of record `i` (empty when untracked).
    #[inline(always)]
    pub(crate) fn anchors_at(&self, i: usize) -> &[(u64, u64)] {
        match self.anchors.get(i) {
            Some(a) => a,
            None => &[],
        }
    }
}

impl<T: Record> RecordBuf for Records<T> {
    fn len(&self) -> usize {
        self.items.len()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn recycle(mut self: Box<Self>, batch_size: usize) -> Option<AnyRecords> {
        if self.items.capacity() > 2 * batch_size {
            return None;
        }
        self.items.clear();
        self.anchors.clear();
        Some(self)
    }

    fn to_tuples(&self, start: usize) -> (Vec<Option<Tuple>>, Vec<(Anchors, String)>) {
        let mut tuples = Vec::with_capacity(self.items.len().saturating_sub(start));
        let mut failed = Vec::new();
        let meta = self.meta;
        for (i, item) in self.items.iter().enumerate().skip(start) {
            let anchors: Anchors = self.anchors_at(i).iter().copied().collect();
            match crate::typed::to_values(item) {
                Ok(values) if values.len() == meta.fields.len() => {
                    tuples.push(Some(Tuple { meta, values, anchors }));
                }
                Ok(values) => failed.push((anchors, mismatch(meta, values.len()))),
                Err(e) => failed.push((anchors, encode_error(meta, &e))),
            }
        }
        (tuples, failed)
    }
}

#[cold]
fn mismatch(meta: &StreamMeta, got: usize) -> String {
    format!(
        "a record of {} values emitted by `{}` on stream `{}`, which declares {} fields {:?}",
        got,
        meta.component,
        meta.stream,
        meta.fields.len(),
        meta.fields.to_vec()
    )
}

#[cold]
fn encode_error(meta: &StreamMeta, e: &TypedError) -> String {
    format!(
        "a record emitted by `{}` on stream `{}` does not encode into tuple values: {e}",
        meta.component, meta.stream
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuple::Fields;

    #[derive(serde::Serialize)]
    struct Word {
        word: String,
        n: u64,
    }

    fn meta() -> &'static StreamMeta {
        StreamMeta { component: "split".into(), task: 0, stream: "default".into(), fields: Fields::new(&["word", "n"]) }
            .intern()
    }

    #[test]
    fn anchors_column_only_from_the_first_tracked_record() {
        let mut r = Records::new(meta(), 4);
        r.push(Word { word: "a".into(), n: 1 }, Anchors::new());
        assert!(r.anchors.is_empty());
        let mut a = Anchors::new();
        a.push((7, 9));
        r.push(Word { word: "b".into(), n: 2 }, a);
        r.push(Word { word: "c".into(), n: 3 }, Anchors::new());
        assert_eq!(r.anchors_at(0), &[]);
        assert_eq!(r.anchors_at(1), &[(7, 9)]);
        assert_eq!(r.anchors_at(2), &[]);
        let (tuples, failed) = r.to_tuples(1);
        assert!(failed.is_empty());
        let tuples: Vec<Tuple> = tuples.into_iter().flatten().collect();
        assert_eq!(tuples.len(), 2);
        assert_eq!(tuples[0].get_str("word").unwrap(), "b");
        assert_eq!(tuples[0].get_u64("n").unwrap(), 2);
        assert_eq!(&tuples[0].anchors[..], &[(7, 9)]);
        assert!(tuples[1].anchors.is_empty());
        assert_eq!(tuples[1].stream(), "default");
        assert_eq!(tuples[1].source_component(), "split");
    }
}
