//! The Kinesis model (`squall_test_support::kinesismodel`, the Kinesis of the simulator) kept
//! honest against kinesis-local: random sequences of puts (partition keys and explicit hash
//! keys), shard iterators of every type, GetRecords with small limits, splits and merges, and
//! listings, run against both from the same seed, every answer compared: the shard a record went
//! to, the records read and their order, where a shard ends (no next iterator), the shards
//! (ids, lineage, hash ranges, open or closed) and the errors (by code).
//!
//! Left out, each a known difference of kinesis-local from AWS that the model does not copy:
//! ChildShards at a shard's end (kinesis-local names none), a closed shard's ending sequence
//! number (a sentinel), MillisBehindLatest's value (only whether the reader is caught up is
//! compared); sequence numbers are compared by the records they name, not by value; the split
//! of a new stream's key space (the model starts from kinesis-local's ranges; its own split is
//! checked against AWS's documented one); GetShardIterator on a shard that holds no records,
//! which kinesis-local answers with an iterator whatever the timestamp or sequence number; the
//! code of the refusal of another shard's sequence number (kinesis-local
//! ResourceNotFoundException, AWS InvalidArgumentException: only that both refuse is compared). Iterator
//! expiry (5 minutes) is the model's own, not compared here.
//!
//! Enhanced fan-out (the second test): a consumer registered in both, random puts, splits and
//! subscriptions (TRIM_HORIZON, AT_SEQUENCE_NUMBER, AFTER_SEQUENCE_NUMBER, AT_TIMESTAMP, and
//! AFTER_SEQUENCE_NUMBER of an earlier subscription's last continuation sequence), each read
//! until caught up; compared: the records delivered, in order. Left out: the end of a closed
//! shard (kinesis-local sends no ChildShards and keeps a continuation), the rule that refuses a
//! second subscription within 5 s (kinesis-local refuses one only while another is live, inside
//! the event stream; the model follows AWS, and the test moves the model's clock 5 s on between
//! subscriptions), how often events come, and the consumer's CREATING time.

use squall_test_support as support;

use std::time::Duration;

use aws_sdk_kinesis::primitives::{Blob, DateTime};
use aws_sdk_kinesis::types::{ShardIteratorType, StartingPosition, SubscribeToShardEventStream};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::TestStream;
use support::kinesismodel::{IteratorType, KinesisModel};

const KEYS: [&str; 8] = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"];

#[derive(Debug, Clone)]
enum Kind {
    TrimHorizon,
    Latest,
    AtSeq(usize),
    AfterSeq(usize),
    AtMark(usize),
    Future,
}

/// A new stream of two shards in kinesis-local, and the model's stream over the same hash
/// ranges (kinesis-local splits the key space a little differently from AWS; the model's own
/// split, AWS's, is checked below).
async fn stream_and_model(prefix: &str) -> (TestStream, KinesisModel) {
    let s = TestStream::create(prefix, 2).await;
    let mut model = KinesisModel::new();
    model.set_now(squall::coord::now_ms());
    let ranges: Vec<(u128, u128)> = support::ops::list_shards(&s.client, &s.name)
        .await
        .iter()
        .map(|d| (d.starting_hash_key.parse().unwrap(), d.ending_hash_key.parse().unwrap()))
        .collect();
    model.create_stream_with_ranges(&s.name, &ranges).unwrap();
    (s, model)
}

/// Splits a random open shard in kinesis-local and the model (in the middle of its hash range,
/// as `squall::kinesis::split_shard` does), unless `max_open` shards are open: the step, and
/// what each answered.
async fn split_both(
    s: &TestStream,
    model: &mut KinesisModel,
    rng: &mut StdRng,
    max_open: usize,
) -> Option<(String, String, String)> {
    let open: Vec<_> = model.list_shards(&s.name).unwrap().into_iter().filter(|s| s.end_seq.is_none()).collect();
    if open.len() >= max_open {
        return None;
    }
    let sh = &open[rng.random_range(0..open.len())];
    let r = squall::kinesis::split_shard(&s.client, &s.label(), &s.name, &sh.shard_id)
        .await
        .map_or_else(|e| format!("error {e}"), |_| "split".to_string());
    let mid = sh.start_hash + (sh.end_hash - sh.start_hash) / 2 + 1;
    let m = model
        .split_shard(&s.name, &sh.shard_id, mid)
        .map_or_else(|e| format!("error {}", e.code()), |()| "split".to_string());
    Some((format!("split {}", sh.shard_id), r, m))
}

async fn run_seed(seed: u64, steps: usize) {
    let (s, mut model) = stream_and_model("kmodel").await;
    let (client, name) = (s.client.clone(), s.name.clone());
    let mut rng = StdRng::seed_from_u64(seed);
    // records put so far: (real sequence, model sequence)
    let mut recs: Vec<(String, String)> = Vec::new();
    // times between puts, far from any arrival
    let mut marks: Vec<i64> = Vec::new();
    // iterators in use: (real, model), pairs on the same shard
    let mut its: Vec<(Option<String>, Option<String>)> = Vec::new();
    let mut trace = Vec::new();
    for i in 0..steps {
        model.set_now(squall::coord::now_ms());
        let (what, r, m) = match rng.random_range(0..12) {
            0..=3 => {
                let key = KEYS[rng.random_range(0..KEYS.len())];
                let explicit: Option<u128> = rng.random_bool(0.25).then(|| rng.random());
                let data = vec![rng.random::<u8>(); rng.random_range(1..4)];
                let mut req = client.put_record().stream_name(&name).partition_key(key).data(Blob::new(data.clone()));
                if let Some(h) = explicit {
                    req = req.explicit_hash_key(h.to_string());
                }
                let real = req.send().await;
                model.set_now(squall::coord::now_ms());
                let mm = model.put_record(&name, key, &data, explicit);
                let r = match &real {
                    Ok(o) => o.shard_id.clone(),
                    Err(e) => format!("error {:?}", aws_sdk_kinesis::error::ProvideErrorMetadata::code(e)),
                };
                let m = match &mm {
                    Ok((shard, _)) => shard.clone(),
                    Err(e) => format!("error {:?}", Some(e.code())),
                };
                if let (Ok(o), Ok((_, seq))) = (&real, &mm) {
                    recs.push((o.sequence_number.clone(), seq.clone()));
                }
                (format!("put {key} {explicit:?}"), r, m)
            }
            4 => {
                // a time between two puts, 20 ms from either
                tokio::time::sleep(Duration::from_millis(20)).await;
                marks.push(squall::coord::now_ms());
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            5..=6 => {
                let shards = model.list_shards(&name).unwrap();
                let shard = shards[rng.random_range(0..shards.len())].shard_id.clone();
                let kind = match rng.random_range(0..6) {
                    0 => Kind::TrimHorizon,
                    1 => Kind::Latest,
                    2 if !recs.is_empty() => Kind::AtSeq(rng.random_range(0..recs.len())),
                    3 if !recs.is_empty() => Kind::AfterSeq(rng.random_range(0..recs.len())),
                    4 if !marks.is_empty() => Kind::AtMark(rng.random_range(0..marks.len())),
                    5 => Kind::Future,
                    _ => Kind::TrimHorizon,
                };
                let req = client.get_shard_iterator().stream_name(&name).shard_id(&shard);
                let future = squall::coord::now_ms() + 60_000;
                let (req, mk) = match &kind {
                    Kind::TrimHorizon => {
                        (req.shard_iterator_type(ShardIteratorType::TrimHorizon), IteratorType::TrimHorizon)
                    }
                    Kind::Latest => (req.shard_iterator_type(ShardIteratorType::Latest), IteratorType::Latest),
                    Kind::AtSeq(k) => (
                        req.shard_iterator_type(ShardIteratorType::AtSequenceNumber)
                            .starting_sequence_number(&recs[*k].0),
                        IteratorType::AtSequence(recs[*k].1.clone()),
                    ),
                    Kind::AfterSeq(k) => (
                        req.shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                            .starting_sequence_number(&recs[*k].0),
                        IteratorType::AfterSequence(recs[*k].1.clone()),
                    ),
                    Kind::AtMark(k) => (
                        req.shard_iterator_type(ShardIteratorType::AtTimestamp)
                            .timestamp(DateTime::from_millis(marks[*k])),
                        IteratorType::AtTimestamp(marks[*k]),
                    ),
                    Kind::Future => (
                        req.shard_iterator_type(ShardIteratorType::AtTimestamp)
                            .timestamp(DateTime::from_millis(future)),
                        IteratorType::AtTimestamp(future),
                    ),
                };
                let real = req.send().await;
                let mm = model.get_shard_iterator(&name, &shard, mk);
                // a sequence number of another shard: both refuse it, or neither
                let r = match &real {
                    Ok(_) => "iterator".to_string(),
                    Err(e) => format!("error {:?}", aws_sdk_kinesis::error::ProvideErrorMetadata::code(e)),
                };
                let mut m = match &mm {
                    Ok(_) => "iterator".to_string(),
                    Err(e) => format!("error {:?}", Some(e.code())),
                };
                // kinesis-local answers any request on an empty shard with an iterator at its
                // start, without checking the timestamp or sequence number (AWS checks both)
                if model.shard_records(&name, &shard).unwrap() == 0 && mm.is_err() && r == "iterator" {
                    m = format!("iterator (kinesis-local on an empty shard; the model and AWS: {m})");
                }
                // a sequence number of another shard: AWS answers InvalidArgumentException (so
                // does the model), kinesis-local ResourceNotFoundException; the refusal is compared
                if matches!(kind, Kind::AtSeq(_) | Kind::AfterSeq(_)) && mm.is_err() && r.starts_with("error") {
                    m = format!("{r} (the model and AWS: {m})");
                }
                if let (Ok(o), Ok(it)) = (real, mm) {
                    its.push((o.shard_iterator, Some(it)));
                }
                (format!("iterator {shard} {kind:?}"), r, m)
            }
            7..=9 if !its.is_empty() => {
                let k = rng.random_range(0..its.len());
                let limit = rng.random_range(1..5);
                let (Some(ri), Some(mi)) = its[k].clone() else {
                    its.remove(k);
                    continue;
                };
                let real = client.get_records().shard_iterator(&ri).limit(limit).send().await;
                let mm = model.get_records(&mi, limit as usize);
                let r = match &real {
                    Ok(o) => {
                        let recs: Vec<(String, Vec<u8>)> =
                            o.records.iter().map(|r| (r.partition_key.clone(), r.data.as_ref().to_vec())).collect();
                        let caught_up = o.records.is_empty() || o.millis_behind_latest == Some(0);
                        format!("{recs:?} end {} caught up {caught_up}", o.next_shard_iterator.is_none())
                    }
                    Err(e) => format!("error {:?}", aws_sdk_kinesis::error::ProvideErrorMetadata::code(e)),
                };
                let m = match &mm {
                    Ok(o) => {
                        let recs: Vec<(String, Vec<u8>)> =
                            o.records.iter().map(|r| (r.partition_key.clone(), r.data.clone())).collect();
                        let caught_up = o.records.is_empty() || o.millis_behind_latest == 0;
                        format!("{recs:?} end {} caught up {caught_up}", o.next_iterator.is_none())
                    }
                    Err(e) => format!("error {:?}", Some(e.code())),
                };
                match (real, mm) {
                    (Ok(o), Ok(out)) => its[k] = (o.next_shard_iterator, out.next_iterator),
                    _ => {
                        its.remove(k);
                    }
                }
                (format!("get {k} limit {limit}"), r, m)
            }
            10 => match split_both(&s, &mut model, &mut rng, 6).await {
                Some(step) => step,
                None => continue,
            },
            11 => {
                let mut open: Vec<_> =
                    model.list_shards(&name).unwrap().into_iter().filter(|s| s.end_seq.is_none()).collect();
                open.sort_by_key(|s| s.start_hash);
                if open.len() < 2 {
                    continue;
                }
                let j = rng.random_range(0..open.len() - 1);
                let (a, b) = (open[j].shard_id.clone(), open[j + 1].shard_id.clone());
                let r = squall::kinesis::merge_shards(&client, &s.label(), &name, &a, &b)
                    .await
                    .map_or_else(|e| format!("error {e}"), |()| "merged".to_string());
                let m = model
                    .merge_shards(&name, &a, &b)
                    .map_or_else(|e| format!("error {}", e.code()), |()| "merged".to_string());
                (format!("merge {a} {b}"), r, m)
            }
            _ => {
                let real = support::ops::list_shards(&client, &name).await;
                let r: Vec<String> = real
                    .iter()
                    .map(|d| {
                        format!(
                            "{} {:?} {:?} {}..{} {}",
                            d.shard_id,
                            d.parent_shard_id,
                            d.adjacent_parent_shard_id,
                            d.starting_hash_key,
                            d.ending_hash_key,
                            if d.closed { "closed" } else { "open" }
                        )
                    })
                    .collect();
                let m: Vec<String> = model
                    .list_shards(&name)
                    .unwrap()
                    .iter()
                    .map(|d| {
                        format!(
                            "{} {:?} {:?} {}..{} {}",
                            d.shard_id,
                            d.parent,
                            d.adjacent_parent,
                            d.start_hash,
                            d.end_hash,
                            if d.end_seq.is_some() { "closed" } else { "open" }
                        )
                    })
                    .collect();
                ("list".to_string(), format!("{r:#?}"), format!("{m:#?}"))
            }
        };
        trace.push(format!("{i}: {what}\n    kinesis-local: {r}\n    model:         {m}"));
        let m = if m.starts_with(&format!("{r} (")) { r.clone() } else { m };
        assert_eq!(r, m, "seed {seed}, step {i} differs:\n{}", trace.join("\n"));
    }
    s.delete().await;
}

/// A new stream's shards split the key space as AWS does (its documented three-shard stream).
#[test]
fn the_models_new_stream_splits_the_key_space_as_aws_does() {
    let mut model = KinesisModel::new();
    model.create_stream("three", 3).unwrap();
    let ranges: Vec<(String, String)> = model
        .list_shards("three")
        .unwrap()
        .iter()
        .map(|s| (s.start_hash.to_string(), s.end_hash.to_string()))
        .collect();
    let aws = [
        ("0", "113427455640312821154458202477256070484"),
        ("113427455640312821154458202477256070485", "226854911280625642308916404954512140969"),
        ("226854911280625642308916404954512140970", "340282366920938463463374607431768211455"),
    ];
    let aws: Vec<(String, String)> = aws.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    assert_eq!(ranges, aws);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kinesis_model_answers_as_kinesis_local_does_where_it_follows_aws() {
    let seeds: u64 = std::env::var("SQUALL_KINESIS_MODEL_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(8);
    let first: u64 = std::env::var("SQUALL_KINESIS_MODEL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    for seed in first..first + seeds {
        run_seed(seed, 50).await;
    }
    eprintln!("Kinesis model: {seeds} seeds of 50 steps each agree with kinesis-local (seeds {first}..)");
}

/// Where a subscription of the EFO differential test starts.
#[derive(Debug, Clone)]
enum From {
    TrimHorizon,
    AtSeq(usize),
    AfterSeq(usize),
    AtMark(usize),
    /// After an earlier subscription's last continuation sequence (real, model).
    Continuation(usize),
}

/// Reads a real subscription until an event says it is caught up: the records (partition key,
/// data) and the last continuation sequence. kinesis-local refuses a subscription while the
/// previous one to the shard is still live (inside the event stream): retried.
async fn read_real(
    client: &aws_sdk_kinesis::Client,
    consumer: &str,
    shard: &str,
    pos: StartingPosition,
) -> Result<(Vec<(String, Vec<u8>)>, Option<String>), String> {
    for _ in 0..20 {
        let out = client
            .subscribe_to_shard()
            .consumer_arn(consumer)
            .shard_id(shard)
            .starting_position(pos.clone())
            .send()
            .await;
        let mut out = match out {
            Ok(o) => o,
            Err(e) => return Err(format!("error {:?}", aws_sdk_kinesis::error::ProvideErrorMetadata::code(&e))),
        };
        let mut recs = Vec::new();
        let mut cont = None;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let ev = tokio::time::timeout_at(deadline, out.event_stream.recv())
                .await
                .map_err(|_| format!("no caught-up event from {shard} in 20 s"))?;
            match ev {
                Ok(Some(SubscribeToShardEventStream::SubscribeToShardEvent(ev))) => {
                    recs.extend(ev.records.iter().map(|r| (r.partition_key.clone(), r.data.as_ref().to_vec())));
                    cont = Some(ev.continuation_sequence_number.clone());
                    if ev.millis_behind_latest == 0 {
                        return Ok((recs, cont));
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => return Ok((recs, cont)),
                Err(e) if format!("{e:?}").contains("ResourceInUse") => break,
                Err(e) => return Err(format!("event stream error {e:?}")),
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(format!("the subscription to {shard} stayed in use"))
}

async fn run_efo_seed(seed: u64, steps: usize) {
    use support::kinesismodel::{CONSUMER_CREATING_MS, RESUBSCRIBE_IN_USE_MS};
    let (s, mut model) = stream_and_model("kmodel-efo").await;
    let (client, name) = (s.client.clone(), s.name.clone());
    // the model's clock: the real one plus `offset`, moved on between subscriptions (the model
    // refuses a second one within 5 s, as AWS does)
    let mut offset = 0i64;
    let stream_arn = support::ops::stream_arn(&client, &name).await;
    let real_consumer = client
        .register_stream_consumer()
        .stream_arn(&stream_arn)
        .consumer_name("model")
        .send()
        .await
        .unwrap()
        .consumer
        .unwrap()
        .consumer_arn;
    let model_consumer = model.register_consumer(&model.stream_arn(&name).unwrap(), "model").unwrap();
    offset += CONSUMER_CREATING_MS;
    // the real consumer ACTIVE
    for _ in 0..100 {
        let d = client.describe_stream_consumer().consumer_arn(&real_consumer).send().await.unwrap();
        if d.consumer_description.unwrap().consumer_status == aws_sdk_kinesis::types::ConsumerStatus::Active {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut rng = StdRng::seed_from_u64(seed);
    // records put: (real sequence, model sequence, shard)
    let mut recs: Vec<(String, String, String)> = Vec::new();
    // times between puts: (real, model)
    let mut marks: Vec<(i64, i64)> = Vec::new();
    // continuations of earlier subscriptions: (real, model, shard)
    let mut conts: Vec<(String, String, String)> = Vec::new();
    let mut trace = Vec::new();
    for i in 0..steps {
        model.set_now(squall::coord::now_ms() + offset);
        let (what, r, m) = match rng.random_range(0..10) {
            0..=4 => {
                let key = KEYS[rng.random_range(0..KEYS.len())];
                let data = vec![rng.random::<u8>(); rng.random_range(1..4)];
                let real = client
                    .put_record()
                    .stream_name(&name)
                    .partition_key(key)
                    .data(Blob::new(data.clone()))
                    .send()
                    .await
                    .unwrap();
                model.set_now(squall::coord::now_ms() + offset);
                let (shard, seq) = model.put_record(&name, key, &data, None).unwrap();
                recs.push((real.sequence_number.clone(), seq, shard.clone()));
                (format!("put {key}"), real.shard_id, shard)
            }
            5 => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let now = squall::coord::now_ms();
                marks.push((now, now + offset));
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            6 => match split_both(&s, &mut model, &mut rng, 4).await {
                Some(step) => step,
                None => continue,
            },
            _ => {
                let shards = model.list_shards(&name).unwrap();
                let shard = shards[rng.random_range(0..shards.len())].shard_id.clone();
                let mine: Vec<usize> = (0..recs.len()).filter(|k| recs[*k].2 == shard).collect();
                let theirs: Vec<usize> = (0..conts.len()).filter(|k| conts[*k].2 == shard).collect();
                let from = match rng.random_range(0..5) {
                    1 if !mine.is_empty() => From::AtSeq(mine[rng.random_range(0..mine.len())]),
                    2 if !mine.is_empty() => From::AfterSeq(mine[rng.random_range(0..mine.len())]),
                    3 if !marks.is_empty() => From::AtMark(rng.random_range(0..marks.len())),
                    4 if !theirs.is_empty() => From::Continuation(theirs[rng.random_range(0..theirs.len())]),
                    _ => From::TrimHorizon,
                };
                let b = StartingPosition::builder();
                let (pos, kind) = match &from {
                    From::TrimHorizon => (b.r#type(ShardIteratorType::TrimHorizon), IteratorType::TrimHorizon),
                    From::AtSeq(k) => (
                        b.r#type(ShardIteratorType::AtSequenceNumber).sequence_number(&recs[*k].0),
                        IteratorType::AtSequence(recs[*k].1.clone()),
                    ),
                    From::AfterSeq(k) => (
                        b.r#type(ShardIteratorType::AfterSequenceNumber).sequence_number(&recs[*k].0),
                        IteratorType::AfterSequence(recs[*k].1.clone()),
                    ),
                    From::AtMark(k) => (
                        b.r#type(ShardIteratorType::AtTimestamp).timestamp(DateTime::from_millis(marks[*k].0)),
                        IteratorType::AtTimestamp(marks[*k].1),
                    ),
                    From::Continuation(k) => (
                        b.r#type(ShardIteratorType::AfterSequenceNumber).sequence_number(&conts[*k].0),
                        IteratorType::AfterSequence(conts[*k].1.clone()),
                    ),
                };
                let real = read_real(&client, &real_consumer, &shard, pos.build().unwrap()).await;
                offset += RESUBSCRIBE_IN_USE_MS;
                model.set_now(squall::coord::now_ms() + offset);
                let mm = model.subscribe(&model_consumer, &shard, kind).and_then(|mut sub| {
                    let mut got = Vec::new();
                    let mut cont = None;
                    while let Some(ev) = model.next_event(&mut sub, 10_000)? {
                        got.extend(ev.records.iter().map(|r| (r.partition_key.clone(), r.data.clone())));
                        let end = ev.continuation.is_none();
                        cont = ev.continuation;
                        if ev.millis_behind_latest == 0 || end {
                            break;
                        }
                    }
                    Ok((got, cont))
                });
                let r = match &real {
                    Ok((got, _)) => format!("{got:?}"),
                    Err(e) => e.clone(),
                };
                let m = match &mm {
                    Ok((got, _)) => format!("{got:?}"),
                    Err(e) => format!("error {:?}", e.code()),
                };
                // the continuations of both, for a later subscription (a closed shard's end has
                // none in the model: AWS; kinesis-local keeps one)
                if let (Ok((_, Some(rc))), Ok((_, Some(mc)))) = (&real, &mm) {
                    conts.push((rc.clone(), mc.clone(), shard.clone()));
                }
                (format!("subscribe {shard} {from:?}"), r, m)
            }
        };
        trace.push(format!("{i}: {what}\n    kinesis-local: {r}\n    model:         {m}"));
        assert_eq!(r, m, "seed {seed}, step {i} differs:\n{}", trace.join("\n"));
    }
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kinesis_models_subscriptions_deliver_what_kinesis_local_delivers() {
    let seeds: u64 = std::env::var("SQUALL_KINESIS_MODEL_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(4);
    let first: u64 = std::env::var("SQUALL_KINESIS_MODEL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    for seed in first..first + seeds {
        run_efo_seed(seed, 30).await;
    }
    eprintln!(
        "Kinesis model, enhanced fan-out: {seeds} seeds of 30 steps each agree with kinesis-local (seeds {first}..)"
    );
}
