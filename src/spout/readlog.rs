//! An optional JSON-lines log of what each task read, for audits and tests: which task read which
//! shard from which sequence to which, when it started a shard (and from where), reached its end,
//! finished it (checkpointed as finished) and released it. With it, "no child read before its
//! parents finished" and "never two readers of one shard at once" are checkable after any run.

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// One line of the read log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadLogEntry {
    /// Milliseconds since the epoch.
    pub t_ms: i64,
    /// Task (ZooKeeper task node) that acted.
    pub task: String,
    /// Shard id.
    pub shard: String,
    /// `acquire`, `records`, `end`, `finish`, `release`.
    pub event: String,
    /// First sequence of a batch, or the start position on `acquire`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first: Option<String>,
    /// Last sequence of a batch, or the last record at `end`/`finish`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<String>,
    /// Records in the batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<usize>,
}

/// Appends entries to a file; does nothing when not configured.
#[derive(Clone, Default)]
pub(crate) struct ReadLog(Option<Arc<Mutex<std::fs::File>>>);

impl ReadLog {
    pub fn open(path: Option<&str>) -> std::io::Result<Self> {
        match path {
            None => Ok(Self(None)),
            Some(p) => {
                let f = std::fs::OpenOptions::new().create(true).append(true).open(p)?;
                Ok(Self(Some(Arc::new(Mutex::new(f)))))
            }
        }
    }

    fn write(&self, e: ReadLogEntry) {
        if let Some(f) = &self.0
            && let Ok(mut line) = serde_json::to_vec(&e)
        {
            line.push(b'\n');
            let mut f = f.lock().unwrap_or_else(|p| p.into_inner());
            let _ = f.write_all(&line);
        }
    }

    fn entry(task: &str, shard: &str, event: &str) -> ReadLogEntry {
        ReadLogEntry {
            t_ms: crate::coord::now_ms(),
            task: task.to_string(),
            shard: shard.to_string(),
            event: event.to_string(),
            first: None,
            last: None,
            count: None,
        }
    }

    pub fn acquire(&self, task: &str, shard: &str, from: &str) {
        self.write(ReadLogEntry { first: Some(from.to_string()), ..Self::entry(task, shard, "acquire") });
    }

    pub fn records(&self, task: &str, shard: &str, first: &str, last: &str, count: usize) {
        self.write(ReadLogEntry {
            first: Some(first.to_string()),
            last: Some(last.to_string()),
            count: Some(count),
            ..Self::entry(task, shard, "records")
        });
    }

    pub fn end(&self, task: &str, shard: &str, last: Option<&str>) {
        self.write(ReadLogEntry { last: last.map(str::to_string), ..Self::entry(task, shard, "end") });
    }

    pub fn finish(&self, task: &str, shard: &str) {
        self.write(Self::entry(task, shard, "finish"));
    }

    pub fn release(&self, task: &str, shard: &str) {
        self.write(Self::entry(task, shard, "release"));
    }
}
