//! A Kafka partition's messages, taken from librdkafka in batches. The `rdkafka` crate reads a
//! split-off partition queue one message per call (a lock and a clock read each, which was most of
//! the source's time); `rd_kafka_consume_batch_queue` is only in its raw bindings, so this small
//! wrapper is the one place the Kafka source uses unsafe code.

use std::ffi::{c_void, CStr, CString};
use std::ptr;
use std::sync::Arc;

use rdkafka::bindings as rk;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};

/// librdkafka's "end of partition" event code.
pub const KAFKA_PARTITION_EOF: i32 = -191;

/// One message of a batch, borrowed until the batch advances.
pub struct KafkaMessage<'a> {
    pub offset: i64,
    pub payload: &'a [u8],
    pub key: Option<&'a [u8]>,
    /// A librdkafka error code carried by the message (e.g. KAFKA_PARTITION_EOF), with its text.
    pub error: Option<(i32, String)>,
    /// The record's timestamp (create or log-append time), epoch ms, when it has one.
    pub timestamp: Option<i64>,
}

/// A partition's own queue (split off the consumer's, as rdkafka's `split_partition_queue`
/// does), consumed many messages per call: taking messages one by one costs a lock and a clock
/// read each, which was most of the Kafka source's time.
pub struct PartitionBatches<C: ConsumerContext + 'static> {
    queue: *mut rk::rd_kafka_queue_t,
    msgs: Vec<*mut rk::rd_kafka_message_t>,
    len: usize,
    pos: usize,
    /// Keeps the consumer alive as long as the queue and its messages.
    _consumer: Arc<BaseConsumer<C>>,
}

// SAFETY: librdkafka queues and messages may be used from any thread; the struct is only used
// through `&mut` by one thread at a time.
unsafe impl<C: ConsumerContext + 'static> Send for PartitionBatches<C> {}

impl<C: ConsumerContext + 'static> PartitionBatches<C> {
    /// Takes the partition's messages off the consumer's main queue. None when librdkafka does
    /// not know the partition.
    pub fn split(
        consumer: &Arc<BaseConsumer<C>>,
        topic: &str,
        partition: i32,
        capacity: usize,
    ) -> Option<Self> {
        let t = CString::new(topic).ok()?;
        // SAFETY: the client pointer is valid while `consumer` lives (we keep an Arc); the
        // returned queue is ours to destroy.
        let queue = unsafe {
            rk::rd_kafka_queue_get_partition(consumer.client().native_ptr(), t.as_ptr(), partition)
        };
        if queue.is_null() {
            return None;
        }
        // SAFETY: `queue` is valid; forwarding to NULL detaches it from the consumer queue.
        unsafe { rk::rd_kafka_queue_forward(queue, ptr::null_mut()) };
        Some(PartitionBatches {
            queue,
            msgs: vec![ptr::null_mut(); capacity.max(1)],
            len: 0,
            pos: 0,
            _consumer: Arc::clone(consumer),
        })
    }

    fn release(&mut self) {
        for m in &mut self.msgs[..self.len] {
            if !m.is_null() {
                // SAFETY: each message came from rd_kafka_consume_batch_queue and is destroyed once.
                unsafe { rk::rd_kafka_message_destroy(*m) };
                *m = ptr::null_mut();
            }
        }
        self.len = 0;
        self.pos = 0;
    }

    /// Releases the messages handed out so far and takes the next batch, waiting up to
    /// `timeout_ms` when none is there. Returns how many arrived.
    pub fn refill(&mut self, timeout_ms: i32) -> usize {
        self.release();
        // SAFETY: `msgs` has room for `msgs.len()` pointers; `queue` is valid.
        let n = unsafe {
            rk::rd_kafka_consume_batch_queue(
                self.queue,
                timeout_ms,
                self.msgs.as_mut_ptr(),
                self.msgs.len(),
            )
        };
        self.len = usize::try_from(n).unwrap_or(0).min(self.msgs.len());
        self.len
    }

    /// Drops every message waiting in the queue: a partition assigned again may still hold
    /// messages fetched for its earlier assignment, from another position.
    pub fn discard_waiting(&mut self) -> usize {
        let mut n = 0;
        loop {
            let got = self.refill(0);
            if got == 0 {
                break;
            }
            n += got;
        }
        self.release();
        n
    }

    /// The next message of the current batch.
    pub fn peek(&self) -> Option<KafkaMessage<'_>> {
        if self.pos >= self.len {
            return None;
        }
        let m = self.msgs[self.pos];
        // SAFETY: messages in 0..len are valid until release(); the payload and key buffers
        // belong to the message and live as long as the borrow of `self`.
        unsafe {
            let msg = m.as_ref()?;
            let bytes = |p: *mut c_void, len: usize| -> Option<&[u8]> {
                (!p.is_null()).then(|| std::slice::from_raw_parts(p as *const u8, len))
            };
            let error = (msg.err as i32 != 0).then(|| {
                let text = err_text(rk::rd_kafka_err2str(msg.err));
                (msg.err as i32, text)
            });
            let mut kind = rk::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
            let ts = rk::rd_kafka_message_timestamp(m, &mut kind);
            Some(KafkaMessage {
                offset: msg.offset,
                payload: bytes(msg.payload, msg.len).unwrap_or(&[]),
                key: bytes(msg.key, msg.key_len),
                error,
                timestamp: (ts >= 0
                    && kind != rk::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE)
                    .then_some(ts),
            })
        }
    }

    pub fn advance(&mut self) {
        self.pos += 1;
    }
}

impl<C: ConsumerContext + 'static> Drop for PartitionBatches<C> {
    fn drop(&mut self) {
        self.release();
        // SAFETY: the queue is ours and destroyed once, before the consumer (held by the Arc).
        unsafe { rk::rd_kafka_queue_destroy(self.queue) };
    }
}

/// The text of a librdkafka error string.
unsafe fn err_text(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: librdkafka returns a static NUL-terminated string.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The partition's high watermark as librdkafka last saw it in a fetch response, without a
/// request to the broker (`rdkafka` only wraps the querying variant). None before any fetch.
pub fn cached_high_watermark<C: ConsumerContext + 'static>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
) -> Option<i64> {
    let t = CString::new(topic).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the client pointer is valid while `consumer` is borrowed; `low` and `high` are
    // valid for writes for the duration of the call, which does not retain them.
    let err = unsafe {
        rk::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            t.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (err == rk::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0).then_some(high)
}
