//! The retained event log of one process: sequence numbers, bounded output
//! retention with explicit gaps, and the consumption cursor of lossless mode.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::model::{Event, EventBody, Exit, OutputStream};

/// Bounds of the retained output. Exit and close events are never evicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogLimits {
    pub max_bytes: usize,
    pub max_chunks: usize,
}

impl Default for LogLimits {
    fn default() -> Self {
        LogLimits {
            max_bytes: 1 << 20,
            max_chunks: 50_000,
        }
    }
}

struct Chunk {
    seq: u64,
    stream: OutputStream,
    data: Bytes,
    /// Output bytes appended up to and including this chunk.
    end_offset: u64,
    /// Output chunks appended up to and including this chunk.
    end_count: u64,
}

/// An [`OutputLog`] as handed to the next binary.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct LogState {
    chunks: Vec<ChunkState>,
    peak_bytes: u64,
    next_seq: u64,
    evicted_through: u64,
    exit: Option<(u64, Exit)>,
    closed: Option<u64>,
    total_bytes: u64,
    total_chunks: u64,
    consumed_seq: u64,
    consumed_bytes: u64,
    consumed_chunks: u64,
    acknowledged_seq: Option<u64>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ChunkState {
    seq: u64,
    stream: OutputStream,
    offset: u64,
    len: u64,
    end_offset: u64,
    end_count: u64,
}

/// Events after a cursor, as `read` and subscriptions hand them out.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Batch {
    pub events: Vec<Event>,
    /// One past the last seq the batch covers.
    pub next_seq: u64,
}

pub struct OutputLog {
    limits: LogLimits,
    chunks: VecDeque<Chunk>,
    retained_bytes: usize,
    peak_bytes: usize,
    next_seq: u64,
    evicted_through: u64,
    exit: Option<(u64, Exit)>,
    closed: Option<u64>,
    total_bytes: u64,
    total_chunks: u64,
    consumed_seq: u64,
    consumed_bytes: u64,
    consumed_chunks: u64,
    /// Lossless mode: output with a seq above this has not been
    /// acknowledged by the owner (it may still be on its way, or lost with a
    /// connection) and is never evicted. `None`: retain mode.
    acknowledged_seq: Option<u64>,
}

impl OutputLog {
    /// A log that evicts by `limits` alone (`keep_unacknowledged` false,
    /// retain mode) or never evicts output the owner has not acknowledged
    /// (lossless mode, whose pausing bounds how much that can be).
    pub fn new(limits: LogLimits, keep_unacknowledged: bool) -> OutputLog {
        OutputLog {
            limits,
            chunks: VecDeque::new(),
            retained_bytes: 0,
            peak_bytes: 0,
            next_seq: 1,
            evicted_through: 0,
            exit: None,
            closed: None,
            total_bytes: 0,
            total_chunks: 0,
            consumed_seq: 0,
            consumed_bytes: 0,
            consumed_chunks: 0,
            acknowledged_seq: keep_unacknowledged.then_some(0),
        }
    }

    fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    pub fn push_output(&mut self, stream: OutputStream, data: Bytes) -> u64 {
        // Room is made before the chunk is added, so what is held never
        // exceeds the limits, even for a moment (a chunk larger than the
        // whole byte limit is still kept, alone).
        while let Some(oldest) = self.chunks.front()
            && (self.retained_bytes + data.len() > self.limits.max_bytes
                || self.chunks.len() >= self.limits.max_chunks)
            && self.evictable(oldest.seq)
        {
            if let Some(old) = self.chunks.pop_front() {
                self.retained_bytes -= old.data.len();
                self.evicted_through = old.seq;
            }
        }
        let seq = self.take_seq();
        self.total_bytes += data.len() as u64;
        self.total_chunks += 1;
        self.retained_bytes += data.len();
        self.chunks.push_back(Chunk {
            seq,
            stream,
            data,
            end_offset: self.total_bytes,
            end_count: self.total_chunks,
        });
        self.peak_bytes = self.peak_bytes.max(self.retained_bytes);
        seq
    }

    pub fn push_exit(&mut self, exit: Exit) -> u64 {
        let seq = self.take_seq();
        self.exit = Some((seq, exit));
        seq
    }

    pub fn push_closed(&mut self) -> u64 {
        let seq = self.take_seq();
        self.closed = Some(seq);
        seq
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    pub fn exit(&self) -> Option<Exit> {
        self.exit.map(|(_, exit)| exit)
    }

    pub fn is_closed(&self) -> bool {
        self.closed.is_some()
    }

    pub fn retained_bytes(&self) -> usize {
        self.retained_bytes
    }

    pub fn retained_chunks(&self) -> usize {
        self.chunks.len()
    }

    pub fn peak_bytes(&self) -> usize {
        self.peak_bytes
    }

    pub fn evicted_through(&self) -> u64 {
        self.evicted_through
    }

    /// Output bytes appended after the consumption cursor.
    pub fn unconsumed_bytes(&self) -> u64 {
        self.total_bytes - self.consumed_bytes
    }

    /// Output chunks appended after the consumption cursor.
    pub fn unconsumed_chunks(&self) -> u64 {
        self.total_chunks - self.consumed_chunks
    }

    fn evictable(&self, seq: u64) -> bool {
        self.acknowledged_seq
            .is_none_or(|acknowledged| seq <= acknowledged)
    }

    /// The log as the next binary takes it over (`engine::handover`): the
    /// retained output is appended to `blob`, which the state names by
    /// offsets.
    pub(crate) fn export(&self, blob: &mut Vec<u8>) -> LogState {
        let chunks = self
            .chunks
            .iter()
            .map(|chunk| {
                let offset = blob.len() as u64;
                blob.extend_from_slice(&chunk.data);
                ChunkState {
                    seq: chunk.seq,
                    stream: chunk.stream,
                    offset,
                    len: chunk.data.len() as u64,
                    end_offset: chunk.end_offset,
                    end_count: chunk.end_count,
                }
            })
            .collect();
        LogState {
            chunks,
            peak_bytes: self.peak_bytes as u64,
            next_seq: self.next_seq,
            evicted_through: self.evicted_through,
            exit: self.exit,
            closed: self.closed,
            total_bytes: self.total_bytes,
            total_chunks: self.total_chunks,
            consumed_seq: self.consumed_seq,
            consumed_bytes: self.consumed_bytes,
            consumed_chunks: self.consumed_chunks,
            acknowledged_seq: self.acknowledged_seq,
        }
    }

    /// The log `state` describes, its output copied out of `blob`; `None`
    /// if the state names bytes `blob` does not hold.
    pub(crate) fn import(limits: LogLimits, state: LogState, blob: &Bytes) -> Option<OutputLog> {
        let mut chunks = VecDeque::with_capacity(state.chunks.len());
        let mut retained_bytes = 0usize;
        for chunk in state.chunks {
            let start = usize::try_from(chunk.offset).ok()?;
            let end = start.checked_add(usize::try_from(chunk.len).ok()?)?;
            if end > blob.len() {
                return None;
            }
            retained_bytes += end - start;
            chunks.push_back(Chunk {
                seq: chunk.seq,
                stream: chunk.stream,
                // Copied: a slice would keep the whole hand-over (every
                // process's output) alive while any chunk of it is held.
                data: Bytes::copy_from_slice(&blob[start..end]),
                end_offset: chunk.end_offset,
                end_count: chunk.end_count,
            });
        }
        Some(OutputLog {
            limits,
            chunks,
            retained_bytes,
            peak_bytes: usize::try_from(state.peak_bytes).unwrap_or(usize::MAX),
            next_seq: state.next_seq,
            evicted_through: state.evicted_through,
            exit: state.exit,
            closed: state.closed,
            total_bytes: state.total_bytes,
            total_chunks: state.total_chunks,
            consumed_seq: state.consumed_seq,
            consumed_bytes: state.consumed_bytes,
            consumed_chunks: state.consumed_chunks,
            acknowledged_seq: state.acknowledged_seq,
        })
    }

    /// Records that the owner holds every event up to `seq`, so it may be
    /// evicted. Only moves forward.
    pub fn acknowledge_through(&mut self, seq: u64) {
        if let Some(acknowledged) = &mut self.acknowledged_seq {
            *acknowledged = (*acknowledged).max(seq);
        }
    }

    /// Records that the owner has consumed every event up to `seq` (it was
    /// read, or handed to a subscription): lossless output resumes once the
    /// owner is less than a window behind. The cursor only moves forward.
    pub fn consume_through(&mut self, seq: u64) {
        if seq <= self.consumed_seq {
            return;
        }
        self.consumed_seq = seq;
        let index = self.chunks.partition_point(|chunk| chunk.seq <= seq);
        let (bytes, count) = if index > 0 {
            let chunk = &self.chunks[index - 1];
            (chunk.end_offset, chunk.end_count)
        } else if let Some(first) = self.chunks.front() {
            // Everything retained is newer than `seq`.
            (
                first.end_offset - first.data.len() as u64,
                first.end_count - 1,
            )
        } else {
            (self.total_bytes, self.total_chunks)
        };
        self.consumed_bytes = self.consumed_bytes.max(bytes);
        self.consumed_chunks = self.consumed_chunks.max(count);
    }

    /// Events with seq > `after`, starting with explicit gaps for evicted
    /// output. `max_bytes` (0 = none) budgets output payload over whole
    /// chunks: the first chunk always fits, and collection stops after the
    /// chunk that reaches or passes the budget.
    pub fn collect(&self, after: u64, max_bytes: usize) -> Batch {
        let mut events = Vec::new();
        let mut cursor = after + 1;
        let exit_seq = self.exit.map(|(seq, _)| seq);

        if cursor <= self.evicted_through {
            if let Some(exit_seq) = exit_seq.filter(|&e| e >= cursor && e <= self.evicted_through) {
                if cursor < exit_seq {
                    events.push(gap(cursor, exit_seq - 1));
                }
                events.push(self.exit_event());
                cursor = exit_seq + 1;
            }
            if cursor <= self.evicted_through {
                events.push(gap(cursor, self.evicted_through));
            }
            cursor = self.evicted_through + 1;
        }

        let mut budget_spent = 0usize;
        let mut stopped_at = None;
        let start = self.chunks.partition_point(|chunk| chunk.seq < cursor);
        for chunk in self.chunks.range(start..) {
            if exit_seq.is_some_and(|e| e >= cursor && e < chunk.seq) {
                events.push(self.exit_event());
            }
            events.push(Event {
                seq: chunk.seq,
                body: EventBody::Output {
                    stream: chunk.stream,
                    data: chunk.data.clone(),
                },
            });
            cursor = chunk.seq + 1;
            budget_spent += chunk.data.len();
            if max_bytes > 0 && budget_spent >= max_bytes {
                stopped_at = Some(chunk.seq);
                break;
            }
        }

        if let Some(last) = stopped_at {
            // More output may follow; the caller resumes after `last`.
            return Batch {
                events,
                next_seq: last + 1,
            };
        }
        if exit_seq.is_some_and(|e| e >= cursor) {
            events.push(self.exit_event());
        }
        if let Some(closed_seq) = self.closed.filter(|&c| c >= cursor) {
            events.push(Event {
                seq: closed_seq,
                body: EventBody::Closed,
            });
        }
        Batch {
            events,
            next_seq: self.next_seq,
        }
    }

    fn exit_event(&self) -> Event {
        let (seq, exit) = self.exit.expect("only called when the exit is logged");
        Event {
            seq,
            body: EventBody::Exited(exit),
        }
    }
}

fn gap(from_seq: u64, through: u64) -> Event {
    Event {
        seq: through,
        body: EventBody::Gap { from_seq },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ExitStatus;

    fn output(seq: u64, stream: OutputStream, data: &'static [u8]) -> Event {
        Event {
            seq,
            body: EventBody::Output {
                stream,
                data: Bytes::from_static(data),
            },
        }
    }

    fn seqs(batch: &Batch) -> Vec<u64> {
        batch.events.iter().map(|e| e.seq).collect()
    }

    #[test]
    fn a_handed_over_log_reads_as_the_one_it_was() {
        let limits = LogLimits {
            max_bytes: 8,
            max_chunks: 10,
        };
        let mut log = OutputLog::new(limits, false);
        log.push_output(OutputStream::Stdout, Bytes::from_static(b"evicted"));
        log.push_output(OutputStream::Stderr, Bytes::from_static(b"err"));
        log.push_output(OutputStream::Stdout, Bytes::from_static(b"out"));
        log.push_exit(ExitStatus::Code(3).into());
        log.consume_through(2);
        let mut blob = b"before".to_vec();
        let state = log.export(&mut blob);
        let text = serde_json::to_vec(&state).expect("encode");
        let state: LogState = serde_json::from_slice(&text).expect("decode");
        let mut taken = OutputLog::import(limits, state, &Bytes::from(blob)).expect("import");
        assert_eq!(taken.collect(0, 0), log.collect(0, 0));
        assert_eq!(taken.unconsumed_bytes(), log.unconsumed_bytes());
        assert_eq!(taken.retained_bytes(), 6);
        assert_eq!(taken.push_closed(), 5);
        let short = log.export(&mut Vec::new());
        assert!(OutputLog::import(limits, short, &Bytes::from_static(b"ab")).is_none());
    }

    #[test]
    fn one_counter_orders_output_exit_and_close() {
        let mut log = OutputLog::new(LogLimits::default(), false);
        log.push_output(OutputStream::Stdout, Bytes::from_static(b"out"));
        log.push_output(OutputStream::Stderr, Bytes::from_static(b"err"));
        log.push_exit(ExitStatus::Code(7).into());
        log.push_closed();
        let batch = log.collect(0, 0);
        assert_eq!(
            batch.events,
            vec![
                output(1, OutputStream::Stdout, b"out"),
                output(2, OutputStream::Stderr, b"err"),
                Event {
                    seq: 3,
                    body: EventBody::Exited(ExitStatus::Code(7).into())
                },
                Event {
                    seq: 4,
                    body: EventBody::Closed
                },
            ]
        );
        assert_eq!(batch.next_seq, 5);
        assert_eq!(
            log.collect(4, 0),
            Batch {
                events: vec![],
                next_seq: 5
            }
        );
    }

    #[test]
    fn late_output_after_exit_keeps_its_place() {
        let mut log = OutputLog::new(LogLimits::default(), false);
        assert_eq!(log.push_exit(ExitStatus::Code(0).into()), 1);
        assert_eq!(
            log.push_output(OutputStream::Stdout, Bytes::from_static(b"late")),
            2
        );
        assert_eq!(log.push_closed(), 3);
        assert_eq!(seqs(&log.collect(0, 0)), vec![1, 2, 3]);
        assert_eq!(
            log.collect(1, 0).events[0],
            output(2, OutputStream::Stdout, b"late")
        );
        assert_eq!(log.collect(1, 0).next_seq, 4);
    }

    #[test]
    fn byte_budget_counts_whole_chunks_and_always_returns_the_first() {
        let mut log = OutputLog::new(LogLimits::default(), false);
        for _ in 0..4 {
            log.push_output(OutputStream::Stdout, Bytes::from(vec![b'x'; 10]));
        }
        log.push_exit(ExitStatus::Code(0).into());
        let first = log.collect(0, 5);
        assert_eq!(seqs(&first), vec![1]);
        assert_eq!(first.next_seq, 2);
        let two = log.collect(0, 20);
        assert_eq!(seqs(&two), vec![1, 2]);
        assert_eq!(two.next_seq, 3);
        let rest = log.collect(2, 25);
        assert_eq!(seqs(&rest), vec![3, 4, 5]);
        assert_eq!(rest.next_seq, 6);
    }

    #[test]
    fn chunk_limit_evicts_the_oldest_with_an_explicit_gap() {
        let mut log = OutputLog::new(LogLimits::default(), false);
        for _ in 0..50_001 {
            log.push_output(OutputStream::Stdout, Bytes::from_static(b"x"));
        }
        assert_eq!(log.retained_chunks(), 50_000);
        assert_eq!(log.evicted_through(), 1);
        let batch = log.collect(0, 0);
        assert_eq!(
            batch.events[0],
            Event {
                seq: 1,
                body: EventBody::Gap { from_seq: 1 }
            }
        );
        assert_eq!(batch.events.len(), 50_001);
        assert_eq!(batch.events[1].seq, 2);
        assert_eq!(batch.events.last().map(|e| e.seq), Some(50_001));
        assert_eq!(batch.next_seq, 50_002);
        // A reader that was already past the eviction sees no gap.
        assert_eq!(log.collect(1, 0).events[0].seq, 2);
    }

    #[test]
    fn byte_limit_evicts_oldest_output_but_never_the_exit() {
        let limits = LogLimits {
            max_bytes: 25,
            max_chunks: 100,
        };
        let mut log = OutputLog::new(limits, false);
        log.push_output(OutputStream::Stdout, Bytes::from(vec![b'a'; 10])); // 1
        log.push_exit(ExitStatus::Code(3).into()); // 2
        log.push_output(OutputStream::Stdout, Bytes::from(vec![b'b'; 10])); // 3
        log.push_output(OutputStream::Stdout, Bytes::from(vec![b'c'; 10])); // 4
        log.push_output(OutputStream::Stdout, Bytes::from(vec![b'd'; 10])); // 5
        assert_eq!(log.retained_bytes(), 20);
        assert_eq!(log.evicted_through(), 3);
        // Evicted before the next chunk came in: never above the limit.
        assert_eq!(log.peak_bytes(), 20);
        let batch = log.collect(0, 0);
        assert_eq!(
            batch.events,
            vec![
                Event {
                    seq: 1,
                    body: EventBody::Gap { from_seq: 1 }
                },
                Event {
                    seq: 2,
                    body: EventBody::Exited(ExitStatus::Code(3).into())
                },
                Event {
                    seq: 3,
                    body: EventBody::Gap { from_seq: 3 }
                },
                output(4, OutputStream::Stdout, b"cccccccccc"),
                output(5, OutputStream::Stdout, b"dddddddddd"),
            ]
        );
        assert_eq!(seqs(&log.collect(2, 0)), vec![3, 4, 5]);
    }

    #[test]
    fn what_is_held_never_exceeds_the_limits_even_as_a_chunk_comes_in() {
        let mut log = OutputLog::new(LogLimits::default(), false);
        for index in 0..400usize {
            let size = 1 + (index * 7919) % (64 << 10);
            log.push_output(OutputStream::Stdout, Bytes::from(vec![0; size]));
            assert!(log.retained_bytes() <= 1 << 20, "after chunk {index}");
        }
        assert!(log.peak_bytes() <= 1 << 20, "{}", log.peak_bytes());
        assert!(log.peak_bytes() > (1 << 20) - (64 << 10));
        assert!(log.evicted_through() > 0);
    }

    #[test]
    fn consumption_cursor_tracks_bytes_and_chunks() {
        let mut log = OutputLog::new(LogLimits::default(), false);
        log.push_output(OutputStream::Stdout, Bytes::from(vec![0; 100])); // 1
        log.push_output(OutputStream::Stderr, Bytes::from(vec![0; 50])); // 2
        log.push_exit(ExitStatus::Code(0).into()); // 3
        log.push_output(OutputStream::Stdout, Bytes::from(vec![0; 25])); // 4
        assert_eq!(log.unconsumed_bytes(), 175);
        assert_eq!(log.unconsumed_chunks(), 3);
        log.consume_through(1);
        assert_eq!(log.unconsumed_bytes(), 75);
        log.consume_through(3);
        assert_eq!(log.unconsumed_bytes(), 25);
        assert_eq!(log.unconsumed_chunks(), 1);
        log.consume_through(2);
        assert_eq!(log.unconsumed_bytes(), 25);
        log.consume_through(4);
        assert_eq!(log.unconsumed_bytes(), 0);
        assert_eq!(log.unconsumed_chunks(), 0);
    }

    #[test]
    fn lossless_never_evicts_what_was_not_acknowledged() {
        let limits = LogLimits {
            max_bytes: 100,
            max_chunks: 10,
        };
        let mut log = OutputLog::new(limits, true);
        for _ in 0..4 {
            log.push_output(OutputStream::Stdout, Bytes::from(vec![b'x'; 40]));
        }
        // Over the byte limit, yet nothing was acknowledged: all kept.
        assert_eq!((log.retained_chunks(), log.evicted_through()), (4, 0));
        log.acknowledge_through(2);
        log.push_output(OutputStream::Stdout, Bytes::from(vec![b'x'; 40]));
        assert_eq!((log.retained_chunks(), log.evicted_through()), (3, 2));
    }
}
