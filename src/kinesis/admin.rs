//! Stream administration and the test producer, as used by `squall stream ...`.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::{PutRecordsRequestEntry, ScalingType, StreamStatus};

use super::payload::{AuditPayload, Manifest};
use super::{KinesisError, ShardDescription};

/// Creates a stream with `shards` shards and waits until it is ACTIVE.
pub async fn create_stream(client: &Client, endpoint: &str, stream: &str, shards: i32) -> Result<(), KinesisError> {
    if shards < 1 {
        return Err(KinesisError::Config {
            field: "shards".into(),
            reason: format!("is {shards}; a stream needs at least 1 shard (--shards N)"),
        });
    }
    client
        .create_stream()
        .stream_name(stream)
        .shard_count(shards)
        .send()
        .await
        .map_err(|e| KinesisError::from_sdk("CreateStream", stream, endpoint, e))?;
    wait_active(client, endpoint, stream, Duration::from_secs(60)).await
}

/// Waits until the stream's status is ACTIVE (after create, split, merge, scale).
pub async fn wait_active(client: &Client, endpoint: &str, stream: &str, timeout: Duration) -> Result<(), KinesisError> {
    let start = Instant::now();
    loop {
        let out = describe_summary(client, endpoint, stream).await?;
        if let Some(d) = out.stream_description_summary()
            && d.stream_status() == &StreamStatus::Active
        {
            return Ok(());
        }
        if start.elapsed() > timeout {
            return Err(KinesisError::Timeout { stream: stream.to_string(), want: "ACTIVE", secs: timeout.as_secs() });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Lists every shard of the stream (open and closed), following pagination, sorted by shard id.
pub async fn list_shards(client: &Client, endpoint: &str, stream: &str) -> Result<Vec<ShardDescription>, KinesisError> {
    let mut shards = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let req = match &token {
            // With a NextToken, the stream name must not be sent.
            Some(t) => client.list_shards().next_token(t),
            None => client.list_shards().stream_name(stream),
        };
        let out = req.send().await.map_err(|e| KinesisError::from_sdk("ListShards", stream, endpoint, e))?;
        shards.extend(out.shards().iter().map(ShardDescription::from_sdk));
        match out.next_token() {
            Some(t) if !t.is_empty() => token = Some(t.to_string()),
            _ => break,
        }
    }
    shards.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
    Ok(shards)
}

/// The stream's creation time (DescribeStreamSummary), ms since the epoch. A stream deleted and
/// re-created under the same name keeps its shard ids but gets a new creation time.
pub async fn stream_created_ms(client: &Client, endpoint: &str, stream: &str) -> Result<Option<i64>, KinesisError> {
    let out = describe_summary(client, endpoint, stream).await?;
    Ok(out.stream_description_summary().and_then(|d| d.stream_creation_timestamp().to_millis().ok()))
}

async fn describe_summary(
    client: &Client,
    endpoint: &str,
    stream: &str,
) -> Result<aws_sdk_kinesis::operation::describe_stream_summary::DescribeStreamSummaryOutput, KinesisError> {
    client
        .describe_stream_summary()
        .stream_name(stream)
        .send()
        .await
        .map_err(|e| KinesisError::from_sdk("DescribeStreamSummary", stream, endpoint, e))
}

/// Same as [`list_shards`]: the stream's shards with parents, hash ranges and open/closed.
pub async fn describe_stream(
    client: &Client,
    endpoint: &str,
    stream: &str,
) -> Result<Vec<ShardDescription>, KinesisError> {
    list_shards(client, endpoint, stream).await
}

fn find_shard<'a>(
    shards: &'a [ShardDescription],
    stream: &str,
    shard: &str,
) -> Result<&'a ShardDescription, KinesisError> {
    shards
        .iter()
        .find(|s| s.shard_id == shard)
        .ok_or_else(|| KinesisError::ShardNotFound { stream: stream.to_string(), shard: shard.to_string() })
}

fn refused(op: &'static str, stream: &str, message: String) -> KinesisError {
    KinesisError::Refused { op, stream: stream.to_string(), message }
}

/// Splits an open shard at the midpoint of its hash range and waits until the stream is ACTIVE.
/// Returns the new hash key.
pub async fn split_shard(client: &Client, endpoint: &str, stream: &str, shard: &str) -> Result<String, KinesisError> {
    let shards = list_shards(client, endpoint, stream).await?;
    let s = find_shard(&shards, stream, shard)?;
    if s.closed {
        return Err(refused("SplitShard", stream, format!("shard {shard} is closed; split an open shard")));
    }
    let lo: u128 = s
        .starting_hash_key
        .parse()
        .map_err(|_| refused("SplitShard", stream, format!("shard {shard} has a non-numeric hash range")))?;
    let hi: u128 = s
        .ending_hash_key
        .parse()
        .map_err(|_| refused("SplitShard", stream, format!("shard {shard} has a non-numeric hash range")))?;
    if hi <= lo {
        return Err(refused(
            "SplitShard",
            stream,
            format!("shard {shard} covers a single hash key and cannot be split"),
        ));
    }
    let mid = lo + (hi - lo) / 2 + 1;
    client
        .split_shard()
        .stream_name(stream)
        .shard_to_split(shard)
        .new_starting_hash_key(mid.to_string())
        .send()
        .await
        .map_err(|e| KinesisError::from_sdk("SplitShard", stream, endpoint, e))?;
    wait_active(client, endpoint, stream, Duration::from_secs(60)).await?;
    Ok(mid.to_string())
}

/// Merges two adjacent open shards and waits until the stream is ACTIVE.
pub async fn merge_shards(client: &Client, endpoint: &str, stream: &str, a: &str, b: &str) -> Result<(), KinesisError> {
    let shards = list_shards(client, endpoint, stream).await?;
    let sa = find_shard(&shards, stream, a)?;
    let sb = find_shard(&shards, stream, b)?;
    for s in [sa, sb] {
        if s.closed {
            return Err(refused(
                "MergeShards",
                stream,
                format!("shard {} is closed; merge two open shards", s.shard_id),
            ));
        }
    }
    let (lo, hi) = if sa.starting_hash_key.parse::<u128>().ok() < sb.starting_hash_key.parse::<u128>().ok() {
        (sa, sb)
    } else {
        (sb, sa)
    };
    let adjacent = lo.ending_hash_key.parse::<u128>().ok().and_then(|e| e.checked_add(1)).map(|e| e.to_string())
        == Some(hi.starting_hash_key.clone());
    if !adjacent {
        return Err(refused(
            "MergeShards",
            stream,
            format!(
                "shards {a} and {b} are not adjacent (their hash ranges do not touch); see `squall stream describe {stream}`"
            ),
        ));
    }
    client
        .merge_shards()
        .stream_name(stream)
        .shard_to_merge(lo.shard_id.clone())
        .adjacent_shard_to_merge(hi.shard_id.clone())
        .send()
        .await
        .map_err(|e| KinesisError::from_sdk("MergeShards", stream, endpoint, e))?;
    wait_active(client, endpoint, stream, Duration::from_secs(60)).await
}

/// Scales the stream to `shards` open shards (uniform scaling) and waits until it is ACTIVE.
pub async fn scale_stream(client: &Client, endpoint: &str, stream: &str, shards: i32) -> Result<(), KinesisError> {
    if shards < 1 {
        return Err(KinesisError::Config {
            field: "shards".into(),
            reason: format!("is {shards}; scale to at least 1 shard"),
        });
    }
    client
        .update_shard_count()
        .stream_name(stream)
        .target_shard_count(shards)
        .scaling_type(ScalingType::UniformScaling)
        .send()
        .await
        .map_err(|e| KinesisError::from_sdk("UpdateShardCount", stream, endpoint, e))?;
    wait_active(client, endpoint, stream, Duration::from_secs(60)).await
}

/// Deletes the stream.
pub async fn delete_stream(client: &Client, endpoint: &str, stream: &str) -> Result<(), KinesisError> {
    client
        .delete_stream()
        .stream_name(stream)
        .enforce_consumer_deletion(true)
        .send()
        .await
        .map_err(|e| KinesisError::from_sdk("DeleteStream", stream, endpoint, e))?;
    Ok(())
}

/// Options of the test producer.
#[derive(Debug, Clone)]
pub struct PutOptions {
    /// Records to write.
    pub count: u64,
    /// Distinct partition keys (`key-0` .. `key-{keys-1}`), records spread round-robin.
    pub keys: u64,
    /// Records per second, or unlimited.
    pub rate: Option<f64>,
    /// Minimum payload size in bytes.
    pub size: usize,
    /// Run id; a fresh one when empty.
    pub run: String,
    /// Key prefix.
    pub key_prefix: String,
    /// Put every record with this explicit hash key (a decimal 128-bit number), so that all land
    /// in the shard whose hash range holds it, whatever their partition keys.
    pub explicit_hash_key: Option<String>,
    /// Pack up to this many user records into one KPL aggregated Kinesis record (0 or 1: plain
    /// records). The manifest counts user records.
    pub aggregate: usize,
    /// Set to the number of (user) records written so far, as the put goes (for progress
    /// displays).
    pub progress: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
}

impl Default for PutOptions {
    fn default() -> Self {
        Self {
            count: 100,
            keys: 10,
            rate: None,
            size: 0,
            run: String::new(),
            key_prefix: "key-".into(),
            explicit_hash_key: None,
            aggregate: 0,
            progress: None,
        }
    }
}

/// Publishes the records written so far to `opts.progress`.
fn progress(opts: &PutOptions, written: u64) {
    if let Some(p) = &opts.progress {
        p.store(written, std::sync::atomic::Ordering::Relaxed);
    }
}

/// What a producer run wrote.
#[derive(Debug, Clone)]
pub struct PutReport {
    /// The manifest (run id, per-key counts).
    pub manifest: Manifest,
    /// Wall time.
    pub elapsed: Duration,
    /// PutRecords calls made, including retries.
    pub calls: u64,
    /// Records that had to be retried.
    pub retried: u64,
}

/// Writes `count` audit records. Per-key order is guaranteed: a PutRecords batch never holds two
/// records of one key, and a failed record is retried before that key's next record is sent.
pub async fn put_records(
    client: &Client,
    endpoint: &str,
    stream: &str,
    opts: &PutOptions,
) -> Result<PutReport, KinesisError> {
    if opts.keys == 0 {
        return Err(KinesisError::Config {
            field: "keys".into(),
            reason: "is 0; use at least 1 key (--keys K)".into(),
        });
    }
    if let Some(r) = opts.rate
        && !(r > 0.0 && r.is_finite())
    {
        return Err(KinesisError::Config {
            field: "rate".into(),
            reason: format!("is {r}; give a positive records/second (--rate R)"),
        });
    }
    if opts.size > 1_000_000 {
        return Err(KinesisError::Config {
            field: "size".into(),
            reason: format!("is {}; a Kinesis record holds at most 1 MB (--size BYTES)", opts.size),
        });
    }
    let run = if opts.run.is_empty() { crate::random::hex_id(12) } else { opts.run.clone() };
    if opts.aggregate > 1 {
        return put_aggregated(client, endpoint, stream, opts, run).await;
    }
    let start = Instant::now();
    let (keys, target) = key_targets(opts);
    let mut next: Vec<u64> = vec![0; keys.len()];
    let mut written: u64 = 0;
    let mut calls = 0u64;
    let mut retried = 0u64;
    let max_batch = 500usize.min(keys.len()).max(1);
    let mut cursor = 0usize;
    let mut failures_in_row = 0u32;
    while written < opts.count {
        // Build a batch with at most one record per key, round-robin from the cursor.
        let mut batch: Vec<usize> = Vec::with_capacity(max_batch);
        let mut scanned = 0;
        while batch.len() < max_batch && scanned < keys.len() {
            let k = cursor % keys.len();
            cursor += 1;
            scanned += 1;
            if next[k] < target[k] {
                batch.push(k);
            }
        }
        pace(start, opts.rate, written + batch.len() as u64).await;
        let entries: Vec<PutRecordsRequestEntry> = batch
            .iter()
            .map(|&k| {
                let p = AuditPayload::new(&run, &keys[k], next[k], opts.size);
                entry(&keys[k], opts.explicit_hash_key.as_deref(), p.to_bytes())
            })
            .collect::<Result<_, _>>()?;
        calls += 1;
        let Some(out) = send_batch(client, endpoint, stream, entries, &mut failures_in_row).await? else {
            // Retry the same records: nothing advanced.
            retried += batch.len() as u64;
            cursor -= scanned;
            continue;
        };
        let results = out.records();
        for (i, &k) in batch.iter().enumerate() {
            let ok = results.get(i).map(|r| r.error_code().is_none()).unwrap_or(false);
            if ok {
                next[k] += 1;
                written += 1;
            } else {
                // Not advanced: this key's record is sent again before its next one.
                retried += 1;
            }
        }
        progress(opts, written);
    }
    Ok(report(run, stream, &keys, &next, start, calls, retried))
}

/// The producer's key names and how many records each gets (`count` spread over `keys`).
fn key_targets(opts: &PutOptions) -> (Vec<String>, Vec<u64>) {
    let keys: Vec<String> = (0..opts.keys).map(|i| format!("{}{i}", opts.key_prefix)).collect();
    let mut target: Vec<u64> = vec![opts.count / opts.keys; keys.len()];
    for t in target.iter_mut().take((opts.count % opts.keys) as usize) {
        *t += 1;
    }
    (keys, target)
}

/// Sleeps until `done` records are due at `rate` records/s since `start` (no limit: no wait).
async fn pace(start: Instant, rate: Option<f64>, done: u64) {
    if let Some(rate) = rate {
        let due = Duration::from_secs_f64(done as f64 / rate);
        let el = start.elapsed();
        if due > el {
            tokio::time::sleep(due - el).await;
        }
    }
}

/// One PutRecords entry.
fn entry(key: &str, explicit_hash_key: Option<&str>, data: Vec<u8>) -> Result<PutRecordsRequestEntry, KinesisError> {
    PutRecordsRequestEntry::builder()
        .partition_key(key)
        .set_explicit_hash_key(explicit_hash_key.map(str::to_string))
        .data(Blob::new(data))
        .build()
        .map_err(|e| KinesisError::Config { field: "record".into(), reason: e.to_string() })
}

/// Sends one PutRecords call. `Ok(None)`: a retryable failure, backed off (the caller sends the
/// same records again); after 8 in a row the error is returned.
async fn send_batch(
    client: &Client,
    endpoint: &str,
    stream: &str,
    entries: Vec<PutRecordsRequestEntry>,
    failures_in_row: &mut u32,
) -> Result<Option<aws_sdk_kinesis::operation::put_records::PutRecordsOutput>, KinesisError> {
    match client.put_records().stream_name(stream).set_records(Some(entries)).send().await {
        Ok(out) => {
            *failures_in_row = 0;
            Ok(Some(out))
        }
        Err(e) => {
            let err = KinesisError::from_sdk("PutRecords", stream, endpoint, e);
            if err.is_retryable() && *failures_in_row < 8 {
                *failures_in_row += 1;
                tokio::time::sleep(Duration::from_millis(50 << (*failures_in_row).min(6))).await;
                return Ok(None);
            }
            Err(err)
        }
    }
}

/// The report of a put: the manifest of what each key got.
fn report(
    run: String,
    stream: &str,
    keys: &[String],
    next: &[u64],
    start: Instant,
    calls: u64,
    retried: u64,
) -> PutReport {
    let counts: BTreeMap<String, u64> =
        keys.iter().cloned().zip(next.iter().copied()).filter(|(_, c)| *c > 0).collect();
    let total = next.iter().sum();
    PutReport {
        manifest: Manifest { run, stream: stream.to_string(), counts, total },
        elapsed: start.elapsed(),
        calls,
        retried,
    }
}

/// A shard's hash range, both ends included.
fn range_of(d: &ShardDescription) -> Option<(u128, u128)> {
    Some((d.starting_hash_key.parse().ok()?, d.ending_hash_key.parse().ok()?))
}

/// The open shards and their hash ranges.
async fn open_ranges(client: &Client, endpoint: &str, stream: &str) -> Result<Vec<(String, u128, u128)>, KinesisError> {
    Ok(list_shards(client, endpoint, stream)
        .await?
        .iter()
        .filter(|d| !d.closed)
        .filter_map(|d| range_of(d).map(|(a, b)| (d.shard_id.clone(), a, b)))
        .collect())
}

/// An aggregate of one PutRecords call: the shard it is meant for, the user records it packs (key
/// index, how many of that key's next records), and its data.
type PackedAggregate = (String, Vec<(usize, u64)>, super::kpl::Aggregate);

/// [`put_records`] with KPL aggregation, as the KPL does it: user records are grouped by the shard
/// their hash key falls in (from ListShards), up to `opts.aggregate` per aggregated record, one
/// aggregate per open shard per PutRecords call, each put with its first user record's partition
/// key (and explicit hash key). When an aggregate lands in another shard than predicted (the
/// stream was resharded), the shard list is read again and the keys outside the shard it landed in
/// are sent again (consumers drop them there, see `squall::spout`), as the KPL retries them.
/// Per-key order holds: a key's records are consecutive inside an aggregate, and a key's next
/// records are packed only after its previous aggregate was accepted.
async fn put_aggregated(
    client: &Client,
    endpoint: &str,
    stream: &str,
    opts: &PutOptions,
    run: String,
) -> Result<PutReport, KinesisError> {
    use super::kpl;
    let start = Instant::now();
    let (keys, target) = key_targets(opts);
    let hashes: Vec<u128> = keys.iter().map(|k| kpl::hash_key(k, opts.explicit_hash_key.as_deref())).collect();
    let mut next: Vec<u64> = vec![0; keys.len()];
    let (mut written, mut calls, mut retried) = (0u64, 0u64, 0u64);
    let mut shards = open_ranges(client, endpoint, stream).await?;
    let mut failures_in_row = 0u32;
    let mut cursor = 0usize;
    while written < opts.count {
        // One aggregate per open shard: (shard, [(key index, count)], aggregate).
        let mut batch: Vec<PackedAggregate> = Vec::new();
        for (shard, lo, hi) in &shards {
            let mine: Vec<usize> = (0..keys.len())
                .map(|i| (i + cursor) % keys.len())
                .filter(|&k| (*lo..=*hi).contains(&hashes[k]) && next[k] < target[k])
                .collect();
            if mine.is_empty() {
                continue;
            }
            // Round-robin over the shard's keys, up to `aggregate` user records, each key's
            // records consecutive and in order.
            let mut take: Vec<(usize, u64)> = mine.iter().map(|&k| (k, 0)).collect();
            let mut n = 0usize;
            'fill: loop {
                let mut progressed = false;
                for (k, c) in take.iter_mut() {
                    if n >= opts.aggregate {
                        break 'fill;
                    }
                    if next[*k] + *c < target[*k] {
                        *c += 1;
                        n += 1;
                        progressed = true;
                    }
                }
                if !progressed {
                    break;
                }
            }
            take.retain(|(_, c)| *c > 0);
            let payloads: Vec<(usize, Vec<u8>)> = take
                .iter()
                .flat_map(|&(k, c)| (0..c).map(move |j| (k, j)))
                .map(|(k, j)| (k, AuditPayload::new(&run, &keys[k], next[k] + j, opts.size).to_bytes()))
                .collect();
            let users: Vec<kpl::NewUserRecord<'_>> = payloads
                .iter()
                .map(|(k, data)| kpl::NewUserRecord {
                    partition_key: &keys[*k],
                    explicit_hash_key: opts.explicit_hash_key.as_deref(),
                    data,
                })
                .collect();
            let agg = kpl::aggregate(&users)
                .map_err(|e| KinesisError::Config { field: "aggregate".into(), reason: e.to_string() })?;
            batch.push((shard.clone(), take, agg));
        }
        cursor += 1;
        if batch.is_empty() {
            // Every remaining key hashes outside the open shards we know: the list is stale.
            shards = open_ranges(client, endpoint, stream).await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let users_in_batch: u64 = batch.iter().flat_map(|(_, t, _)| t.iter().map(|(_, c)| *c)).sum();
        pace(start, opts.rate, written + users_in_batch).await;
        let entries: Vec<PutRecordsRequestEntry> = batch
            .iter()
            .map(|(_, _, agg)| entry(&agg.partition_key, agg.explicit_hash_key.as_deref(), agg.data.to_vec()))
            .collect::<Result<_, _>>()?;
        calls += 1;
        let Some(out) = send_batch(client, endpoint, stream, entries, &mut failures_in_row).await? else {
            retried += users_in_batch;
            continue; // nothing advanced: the same records are packed again
        };
        let mut stale = false;
        for (i, (predicted, take, _)) in batch.iter().enumerate() {
            let Some(r) = out.records().get(i).filter(|r| r.error_code().is_none()) else {
                retried += take.iter().map(|(_, c)| *c).sum::<u64>();
                continue;
            };
            let landed = r.shard_id().unwrap_or(predicted);
            let range = if landed == predicted {
                shards.iter().find(|s| s.0 == landed).map(|s| (s.1, s.2))
            } else {
                stale = true;
                list_shards(client, endpoint, stream).await?.iter().find(|d| d.shard_id == landed).and_then(range_of)
            };
            for &(k, c) in take {
                if range.is_none_or(|(lo, hi)| (lo..=hi).contains(&hashes[k])) {
                    next[k] += c;
                    written += c;
                } else {
                    retried += c; // dropped by consumers of `landed`: sent again to its own shard
                }
            }
        }
        progress(opts, written);
        if stale {
            shards = open_ranges(client, endpoint, stream).await?;
        }
    }
    Ok(report(run, stream, &keys, &next, start, calls, retried))
}
