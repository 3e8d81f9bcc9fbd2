//! Stages: a topology cut at groupings that must cross workers, connected by intermediate
//! Kinesis streams (as Samza and Kafka Streams do). Kinesis is the shuffle; there is no
//! home-made transport.
//!
//! Every worker runs every stage. The first stage reads the topology's source stream; at a
//! [`Boundary`], a writer bolt puts each tuple of the boundary's stream into an intermediate
//! stream, keyed by the boundary's key fields, so all tuples of one key land on one shard. The
//! next stage reads that stream with the same ZooKeeper-coordinated Kinesis spout (its own
//! shard list, checkpoints, leases and task registry under `streams/{stream}/`), and one shard
//! is read by one task cluster-wide: a fields grouping after the boundary is global across
//! workers.
//!
//! ```no_run
//! use clap::Parser;
//! use squall::stage::{Boundary, Stages};
//! # use squall::topology::*;
//! # struct Split; impl Bolt for Split { async fn execute(&mut self, _t: Tuple, _o: &mut BoltOutput) -> Result<(), ComponentError> { Ok(()) } }
//! # struct Count; impl Bolt for Count { async fn execute(&mut self, _t: Tuple, _o: &mut BoltOutput) -> Result<(), ComponentError> { Ok(()) } }
//!
//! # async fn run() -> anyhow::Result<()> {
//! let args = squall::WorkerArgs::parse();
//! let stages = Stages::new("split", |b, spout| {
//!     b.set_bolt("split", 2, |_| Split).shuffle_grouping(spout).fields(&["word"]);
//! })
//! .then(Boundary::new("words", "split", &["word"]).shards(4), "count", |b, input| {
//!     b.set_bolt("count", 2, |_| Count).fields_grouping(input, &["word"]);
//! });
//! squall::stage::run(args, stages).await
//! # }
//! ```
//!
//! Records use the format in [`codec`]; watermarks and drain markers cross the boundary in
//! band (see [`writer`] and `spout::stage_input`).

pub mod codec;
pub mod registry;
pub mod writer;

use squall_topology::TopologyBuilder;

/// The default shard count of an intermediate stream created on first start.
pub const DEFAULT_SHARDS: i32 = 4;

/// A cut between two stages: the tuples `from` emits on `stream` (fields `fields`) go through
/// an intermediate Kinesis stream, partitioned by `key`.
#[derive(Debug, Clone)]
pub struct Boundary {
    pub(crate) name: String,
    pub(crate) from: String,
    pub(crate) stream: String,
    pub(crate) fields: Vec<String>,
    pub(crate) key: Vec<String>,
    pub(crate) shards: i32,
    pub(crate) writers: usize,
    pub(crate) kinesis_stream: Option<String>,
    pub(crate) watermark_interval_ms: u64,
    pub(crate) exactly_once: bool,
    pub(crate) abort_after_puts: Option<u64>,
}

impl Boundary {
    /// A boundary named `name` (its intermediate stream is `{topology}-{name}` unless set with
    /// [`Boundary::kinesis_stream`]), carrying what component `from` emits on its default
    /// stream, whose declared fields are `fields`. The key defaults to every field.
    pub fn new(name: &str, from: &str, fields: &[&str]) -> Self {
        let fields: Vec<String> = fields.iter().map(|f| f.to_string()).collect();
        Self {
            name: name.into(),
            from: from.into(),
            stream: squall_topology::DEFAULT_STREAM.into(),
            key: fields.clone(),
            fields,
            shards: DEFAULT_SHARDS,
            writers: 1,
            kinesis_stream: None,
            watermark_interval_ms: 1_000,
            exactly_once: false,
            abort_after_puts: None,
        }
    }

    /// The fields whose values decide the shard (a fields grouping across workers).
    pub fn key(mut self, key: &[&str]) -> Self {
        self.key = key.iter().map(|f| f.to_string()).collect();
        self
    }

    /// Shards of the intermediate stream when Squall creates it (on the first worker's start,
    /// or with `squall stream create`). Resharding it later is fine.
    pub fn shards(mut self, n: i32) -> Self {
        self.shards = n;
        self
    }

    /// Writer tasks per worker (default 1; each is a producer of the intermediate stream).
    pub fn writers(mut self, n: usize) -> Self {
        self.writers = n;
        self
    }

    /// Reads `from`'s stream `stream` instead of its default stream.
    pub fn from_stream(mut self, stream: &str) -> Self {
        self.stream = stream.into();
        self
    }

    /// The intermediate Kinesis stream's name (default `{topology}-{name}`).
    pub fn kinesis_stream(mut self, name: &str) -> Self {
        self.kinesis_stream = Some(name.into());
        self
    }

    /// How often a writer sends watermark records to the shards it wrote no data to (ms,
    /// default 1000).
    pub fn watermark_interval_ms(mut self, ms: u64) -> Self {
        self.watermark_interval_ms = ms;
        self
    }

    /// Fault injection (tests): each writer task aborts the process once it has put `n` records
    /// into the intermediate stream, before their inputs are acked
    /// ([`crate::sink::KinesisSinkConfig::abort_after_puts`]). Never in production.
    pub fn abort_after_puts(mut self, n: Option<u64>) -> Self {
        self.abort_after_puts = n;
        self
    }

    /// Carries strong productions with their ids from an [`crate::state::ExactlyOnce`] bolt (with
    /// [`crate::state::StateConfig::production_ids`]) to an `ExactlyOnce` bolt of the next stage,
    /// which then applies each production exactly once. Adds the production fields
    /// ([`crate::state::PRODUCTION_FIELDS`]) to the boundary's fields when missing (`from` must
    /// declare them), and the next stage's input tuples carry the intermediate record's ids too
    /// ([`crate::spout::STAGE_RECORD_ID_FIELDS`], after the boundary's fields).
    pub fn exactly_once(mut self) -> Self {
        for f in crate::state::PRODUCTION_FIELDS {
            if !self.fields.iter().any(|x| x == f) {
                self.fields.push(f.to_string());
            }
        }
        self.exactly_once = true;
        self
    }

    /// The fields of the next stage's input tuples: the boundary's, then (with
    /// [`Boundary::exactly_once`]) the intermediate record's ids.
    pub fn input_fields(&self) -> Vec<String> {
        let mut f = self.fields.clone();
        if self.exactly_once {
            f.extend(crate::spout::STAGE_RECORD_ID_FIELDS.iter().map(|s| s.to_string()));
        }
        f
    }

    /// The intermediate stream's name for `topology`.
    pub fn stream_name(&self, topology: &str) -> String {
        self.kinesis_stream.clone().unwrap_or_else(|| format!("{topology}-{}", self.name))
    }

    /// The component id of the stage input spout reading this boundary.
    pub fn input_id(&self) -> String {
        format!("{}-in", self.name)
    }

    /// The component id of the writer bolt.
    pub fn writer_id(&self) -> String {
        format!("{}-out", self.name)
    }

    /// Checks the boundary; the error names the setting and the fix.
    pub fn validate(&self, topology: &str) -> Result<(), String> {
        let name = self.stream_name(topology);
        if name.is_empty()
            || name.len() > 128
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            return Err(format!(
                "boundary {:?}: intermediate stream name {name:?} is not a valid Kinesis stream name (1-128 of a-z A-Z 0-9 _ - .); rename the boundary or set Boundary::kinesis_stream",
                self.name
            ));
        }
        if self.fields.is_empty() {
            return Err(format!("boundary {:?}: no fields; list the fields of {:?}'s stream", self.name, self.from));
        }
        if let Some(k) = self.key.iter().find(|k| !self.fields.contains(k)) {
            return Err(format!(
                "boundary {:?}: key field {k:?} is not among its fields {:?}; key by declared fields",
                self.name, self.fields
            ));
        }
        if self.exactly_once
            && let Some(f) = self.fields.iter().find(|f| crate::spout::STAGE_RECORD_ID_FIELDS.contains(&f.as_str()))
        {
            return Err(format!(
                "boundary {:?}: field {f:?} is reserved with exactly_once() (the next stage's input adds the \
                     intermediate record's ids {:?}); rename it",
                self.name,
                crate::spout::STAGE_RECORD_ID_FIELDS
            ));
        }
        if self.key.is_empty() {
            return Err(format!("boundary {:?}: empty key; name at least one field", self.name));
        }
        if !(1..=10_000).contains(&self.shards) {
            return Err(format!("boundary {:?}: shards is {}; use 1..=10000", self.name, self.shards));
        }
        if self.writers == 0 {
            return Err(format!("boundary {:?}: writers is 0; use at least 1", self.name));
        }
        if self.watermark_interval_ms == 0 {
            return Err(format!("boundary {:?}: watermark_interval_ms is 0; use at least 1", self.name));
        }
        Ok(())
    }
}

/// Builds the components of one stage: gets the builder and the id of the stage's input spout.
pub type StageBuild<'a> = Box<dyn FnOnce(&mut TopologyBuilder, &str) + 'a>;

/// A topology as stages connected by boundaries.
pub struct Stages<'a> {
    pub(crate) first: (String, StageBuild<'a>),
    pub(crate) rest: Vec<(Boundary, String, StageBuild<'a>)>,
}

impl std::fmt::Debug for Stages<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stages")
            .field("first", &self.first.0)
            .field("rest", &self.rest.iter().map(|(b, n, _)| (b, n)).collect::<Vec<_>>())
            .finish()
    }
}

impl<'a> Stages<'a> {
    /// The first stage, reading the source stream (its spout is [`crate::SPOUT_ID`]).
    pub fn new(name: &str, build: impl FnOnce(&mut TopologyBuilder, &str) + 'a) -> Self {
        Self { first: (name.into(), Box::new(build)), rest: Vec::new() }
    }

    /// Cuts after the last stage at `boundary` and adds the stage reading it; `build` gets the
    /// id of that stage's input spout, whose default stream carries the boundary's fields.
    pub fn then(mut self, boundary: Boundary, name: &str, build: impl FnOnce(&mut TopologyBuilder, &str) + 'a) -> Self {
        self.rest.push((boundary, name.into(), Box::new(build)));
        self
    }

    /// The boundaries, in order.
    pub fn boundaries(&self) -> impl Iterator<Item = &Boundary> {
        self.rest.iter().map(|(b, _, _)| b)
    }

    /// Stage names, in order.
    pub fn names(&self) -> Vec<String> {
        std::iter::once(self.first.0.clone()).chain(self.rest.iter().map(|(_, n, _)| n.clone())).collect()
    }
}

pub use crate::worker::run_stages as run;
pub use crate::worker::run_stages_until as run_until;
