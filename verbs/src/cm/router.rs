//! Routing the events of one rdma_cm event channel to the IDs they belong to (see the
//! module docs of [`crate::cm`]): one waiter reads the channel at a time, copies each event,
//! parks it for its ID or returns it, and acknowledges it at once. Generic over the event
//! source so it is tested without librdmacm.

use std::collections::{HashSet, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::error::Result;

/// Who a wait takes events for: one ID (by its routing key, the `rdma_cm_id` address), or
/// whoever's event comes first ([`EventChannel::get_event`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Taker {
    Id(usize),
    Any,
}

/// What a [`Router`] reads events from: the channel through librdmacm
/// ([`ChannelInner`]), or a test's stand-in.
pub(super) trait EventSource {
    /// An event read and not yet acknowledged.
    type Raw;
    /// What is kept of an event after its acknowledgement: handed to its taker or parked.
    type Event: Send;
    /// Waits up to `timeout` for an event and reads it; `Ok(None)` when none came.
    fn read(&self, timeout: Duration) -> Result<Option<Self::Raw>>;
    /// The routing key of the ID the event belongs to, and a copy of all its takers need;
    /// called before [`ack`](Self::ack), while the event pins its ID.
    fn copy(&self, raw: &Self::Raw) -> (usize, Self::Event);
    /// Acknowledges the event (once: it is consumed).
    fn ack(&self, raw: Self::Raw);
    /// Disposes of an event nobody will take (a connect request: refuses its new ID).
    fn discard(&self, ev: Self::Event);
}

/// The longest single sleep of a wait: a `poll(2)` timeout in milliseconds is an `i32`;
/// a longer wait (up to `Duration::MAX`, "forever") sleeps again.
pub(super) const MAX_SLEEP: Duration = Duration::from_millis(i32::MAX as u64);

/// Routes the events of one channel to the IDs they belong to (module docs): the live IDs'
/// keys, the events parked for them, and the role of the one waiter reading the channel.
pub(super) struct Router<E> {
    routes: Mutex<Routes<E>>,
    /// Signalled when an event is parked or the reading role is given up.
    changed: Condvar,
}

pub(super) struct Routes<E> {
    /// Keys of the IDs that take their events (live `CmId`s on the channel).
    live: HashSet<usize>,
    /// Events read by a wait other than their ID's, with its key, in arrival order.
    parked: VecDeque<(usize, E)>,
    /// Whether a waiter is reading the channel (one at a time: the read, the routing and
    /// the acknowledgement of an event are its alone).
    reading: bool,
}

impl<E> Routes<E> {
    fn take(&mut self, taker: Taker) -> Option<E> {
        let at = match taker {
            Taker::Any => (!self.parked.is_empty()).then_some(0),
            Taker::Id(k) => self.parked.iter().position(|(key, _)| *key == k),
        }?;
        self.parked.remove(at).map(|(_, ev)| ev)
    }
}

/// The reading role, given up (and the other waiters woken) when dropped: also when the
/// read fails or panics, so no waiter waits on a reader that is gone.
pub(super) struct ReadingRole<'a, E>(&'a Router<E>);

impl<E> Drop for ReadingRole<'_, E> {
    fn drop(&mut self) {
        self.0.lock().reading = false;
        self.0.changed.notify_all();
    }
}

impl<E> Router<E> {
    pub(super) fn new() -> Router<E> {
        Router {
            routes: Mutex::new(Routes {
                live: HashSet::new(),
                parked: VecDeque::new(),
                reading: false,
            }),
            changed: Condvar::new(),
        }
    }

    /// The routes; a panic elsewhere while they were locked leaves them consistent (every
    /// change is one push, remove or flag), so a poisoned lock is taken as it is.
    pub(super) fn lock(&self) -> MutexGuard<'_, Routes<E>> {
        self.routes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// From now on, events of `key` read by other waiters are parked for it.
    pub(super) fn register(&self, key: usize) {
        self.lock().live.insert(key);
    }

    /// `key`'s ID is going: its later events are discarded by whoever reads them; returns
    /// those parked for it, for the caller to discard.
    pub(super) fn deregister(&self, key: usize) -> Vec<E> {
        let mut r = self.lock();
        r.live.remove(&key);
        let (gone, kept) = std::mem::take(&mut r.parked)
            .into_iter()
            .partition(|(k, _)| *k == key);
        r.parked = kept;
        gone.into_iter().map(|(_, ev)| ev).collect()
    }

    /// Every parked event (the channel is going).
    pub(super) fn drain(&self) -> Vec<E> {
        self.lock().parked.drain(..).map(|(_, ev)| ev).collect()
    }

    /// Waits until `timeout` from now for an event of `taker`: one parked for it, else one
    /// read from `src` while no other waiter reads. An event read for another live ID is
    /// parked for it; one for a key that is not live is discarded (`taker` `Any` takes
    /// it). `Ok(None)` when the deadline passes; a zero timeout still reads once when no
    /// other waiter is reading.
    pub(super) fn wait<S>(&self, src: &S, taker: Taker, timeout: Duration) -> Result<Option<E>>
    where
        S: EventSource<Event = E>,
    {
        // None: past the end of Instant, i.e. no deadline.
        let deadline = Instant::now().checked_add(timeout);
        let mut first = true;
        let mut r = self.lock();
        loop {
            if let Some(ev) = r.take(taker) {
                return Ok(Some(ev));
            }
            let left = deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(Instant::now())
            });
            if left.is_zero() && !first {
                return Ok(None);
            }
            first = false;
            if r.reading {
                if left.is_zero() {
                    return Ok(None);
                }
                // Another waiter reads: it parks our event, or gives the role up.
                r = self
                    .changed
                    .wait_timeout(r, left.min(MAX_SLEEP))
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                continue;
            }
            r.reading = true;
            drop(r);
            let role = ReadingRole(self);
            let Some(raw) = src.read(left.min(MAX_SLEEP))? else {
                drop(role);
                r = self.lock();
                continue;
            };
            let (key, ev) = src.copy(&raw);
            let mut mine = None;
            let mut orphan = None;
            {
                // Routed before the ack (module docs: the ID cannot go meanwhile), and
                // while holding the role, so no later event of the same ID overtakes it.
                let mut r = self.lock();
                if taker == Taker::Any || taker == Taker::Id(key) {
                    mine = Some(ev);
                } else if r.live.contains(&key) {
                    r.parked.push_back((key, ev));
                } else {
                    orphan = Some(ev);
                }
            }
            src.ack(raw);
            drop(role);
            if let Some(ev) = orphan {
                src.discard(ev);
            }
            if mine.is_some() {
                return Ok(mine);
            }
            r = self.lock();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    // ----------------------------------------------------------------------------------
    // Routing on a shared channel: the router alone, over synthetic events
    // ----------------------------------------------------------------------------------

    /// A channel stand-in for the router alone: an event is (routing key, serial number);
    /// reads, acknowledgements and discards are counted and recorded.
    #[derive(Default)]
    struct Synthetic {
        queue: Mutex<VecDeque<(usize, u32)>>,
        arrived: Condvar,
        reads: std::sync::atomic::AtomicUsize,
        acked: Mutex<Vec<u32>>,
        discarded: Mutex<Vec<u32>>,
    }

    /// An event read and not yet acknowledged (not `Copy`: `ack` consumes it).
    struct SyntheticRaw(usize, u32);

    impl Synthetic {
        fn push(&self, key: usize, serial: u32) {
            self.queue.lock().unwrap().push_back((key, serial));
            self.arrived.notify_all();
        }
        fn reads(&self) -> usize {
            self.reads.load(std::sync::atomic::Ordering::Relaxed)
        }
        fn acked(&self) -> Vec<u32> {
            self.acked.lock().unwrap().clone()
        }
        fn discarded(&self) -> Vec<u32> {
            self.discarded.lock().unwrap().clone()
        }
    }

    impl EventSource for Synthetic {
        type Raw = SyntheticRaw;
        type Event = (usize, u32);

        fn read(&self, timeout: Duration) -> Result<Option<SyntheticRaw>> {
            let deadline = Instant::now() + timeout;
            let mut q = self.queue.lock().unwrap();
            loop {
                if let Some((key, serial)) = q.pop_front() {
                    self.reads
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return Ok(Some(SyntheticRaw(key, serial)));
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(None);
                }
                q = self.arrived.wait_timeout(q, left).unwrap().0;
            }
        }

        fn copy(&self, raw: &SyntheticRaw) -> (usize, (usize, u32)) {
            (raw.0, (raw.0, raw.1))
        }

        fn ack(&self, raw: SyntheticRaw) {
            self.acked.lock().unwrap().push(raw.1);
        }

        fn discard(&self, ev: (usize, u32)) {
            self.discarded.lock().unwrap().push(ev.1);
        }
    }

    const T: Duration = Duration::from_secs(5);

    #[test]
    fn router_parks_another_ids_event_until_that_id_waits() {
        let (r, src) = (Router::new(), Synthetic::default());
        r.register(1);
        r.register(2);
        for (key, serial) in [(2, 10), (2, 11), (1, 12)] {
            src.push(key, serial);
        }
        assert_eq!(r.wait(&src, Taker::Id(1), T).unwrap(), Some((1, 12)));
        // All three read, each acked at once; 2's two parked for it.
        assert_eq!((src.reads(), src.acked()), (3, vec![10, 11, 12]));
        // 2 takes them in order from the parking, without reading the channel.
        assert_eq!(r.wait(&src, Taker::Id(2), T).unwrap(), Some((2, 10)));
        assert_eq!(
            r.wait(&src, Taker::Id(2), Duration::ZERO).unwrap(),
            Some((2, 11))
        );
        assert_eq!(src.reads(), 3);
        assert_eq!(r.wait(&src, Taker::Id(2), Duration::ZERO).unwrap(), None);
        assert_eq!(src.acked(), [10, 11, 12], "acked once each");
        assert!(src.discarded().is_empty());
    }

    #[test]
    fn router_discards_events_of_ids_that_are_not_live_once() {
        let (r, src) = (Router::new(), Synthetic::default());
        r.register(1);
        r.register(2);
        // 7 never was live (a raw ID no CmId holds): acked and discarded, not parked.
        for (key, serial) in [(7, 20), (2, 21), (1, 22)] {
            src.push(key, serial);
        }
        assert_eq!(r.wait(&src, Taker::Id(1), T).unwrap(), Some((1, 22)));
        assert_eq!(src.discarded(), [20]);
        // 2 goes with an event parked: it is handed back (for the caller to discard), and
        // 2's later events are discarded by whoever reads them.
        assert_eq!(r.deregister(2), [(2, 21)]);
        src.push(2, 23);
        src.push(1, 24);
        assert_eq!(r.wait(&src, Taker::Id(1), T).unwrap(), Some((1, 24)));
        assert_eq!(src.discarded(), [20, 23]);
        assert_eq!(src.acked(), [20, 21, 22, 23, 24], "acked once each");
        // A key that comes back (an address reused by a new ID) starts empty.
        r.register(2);
        assert_eq!(r.wait(&src, Taker::Id(2), Duration::ZERO).unwrap(), None);
        assert!(r.drain().is_empty());
    }

    #[test]
    fn router_any_takes_the_oldest_parked_event_then_reads() {
        let (r, src) = (Router::new(), Synthetic::default());
        r.register(1);
        r.register(2);
        for (key, serial) in [(2, 30), (1, 31), (9, 32)] {
            src.push(key, serial);
        }
        assert_eq!(r.wait(&src, Taker::Id(1), T).unwrap(), Some((1, 31)));
        assert_eq!(r.wait(&src, Taker::Any, T).unwrap(), Some((2, 30)));
        // Any takes what no live ID would (the channel's own reader).
        assert_eq!(r.wait(&src, Taker::Any, T).unwrap(), Some((9, 32)));
        assert!(src.discarded().is_empty());
        // A zero timeout still reads once.
        src.push(1, 33);
        assert_eq!(
            r.wait(&src, Taker::Id(1), Duration::ZERO).unwrap(),
            Some((1, 33))
        );
        assert_eq!(src.acked(), [30, 31, 32, 33]);
    }

    #[test]
    fn router_timeout_bounds_the_whole_wait_while_other_ids_events_arrive() {
        let r = Arc::new(Router::new());
        let src = Arc::new(Synthetic::default());
        r.register(1);
        r.register(2);
        const N: u32 = 60;
        let feeder = {
            let src = Arc::clone(&src);
            std::thread::spawn(move || {
                for i in 0..N {
                    src.push(2, i);
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        let wait = Duration::from_millis(300);
        let t0 = Instant::now();
        assert_eq!(r.wait(&*src, Taker::Id(1), wait).unwrap(), None);
        let took = t0.elapsed();
        // A timeout per read would restart with every event of 2 (every 20 ms) and end
        // only after the last (1.2 s and more).
        assert!(
            took >= wait && took < wait + Duration::from_millis(400),
            "{took:?}"
        );
        feeder.join().unwrap();
        // Nothing of 2's was lost: those read meanwhile were parked, in order.
        let mut got = Vec::new();
        while let Some((key, serial)) = r.wait(&*src, Taker::Id(2), Duration::ZERO).unwrap() {
            assert_eq!(key, 2);
            got.push(serial);
        }
        assert_eq!(got, (0..N).collect::<Vec<_>>());
        assert_eq!(src.acked(), got, "acked once each");
    }

    #[test]
    fn router_two_threads_waiting_on_one_channel_each_get_their_own_events() {
        let r = Arc::new(Router::new());
        let src = Arc::new(Synthetic::default());
        r.register(1);
        r.register(2);
        const N: usize = 300;
        let waiter = |key: usize| {
            let (r, src) = (Arc::clone(&r), Arc::clone(&src));
            std::thread::spawn(move || {
                let mut got = Vec::new();
                while got.len() < N {
                    match r.wait(&*src, Taker::Id(key), T).unwrap() {
                        Some((k, serial)) => {
                            assert_eq!(k, key, "event #{serial} of {k} given to {key}");
                            got.push(serial);
                        }
                        None => panic!("{key} waited {T:?} with {} of {N} events", got.len()),
                    }
                }
                got
            })
        };
        let (one, two) = (waiter(1), waiter(2));
        // Interleaved irregularly, with events of no live ID between, and pauses so that
        // both threads take turns reading and parking.
        let (mut sent1, mut sent2, mut strays) = (Vec::new(), Vec::new(), Vec::new());
        let mut serial = 0u32;
        let mut x = 0x2545_f491_u32;
        while sent1.len() < N || sent2.len() < N {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let key = match x % 7 {
                0 => 3,
                1..=3 if sent1.len() < N => 1,
                _ if sent2.len() < N => 2,
                _ => 1,
            };
            src.push(key, serial);
            match key {
                1 => sent1.push(serial),
                2 => sent2.push(serial),
                _ => strays.push(serial),
            }
            serial += 1;
            if x % 16 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        assert_eq!(one.join().unwrap(), sent1, "1's events, in order");
        assert_eq!(two.join().unwrap(), sent2, "2's events, in order");
        // Everything was read; each event acked exactly once; only the strays discarded.
        let mut acked = src.acked();
        acked.sort();
        assert_eq!(acked, (0..serial).collect::<Vec<_>>());
        // (Discarded after the reading role is given up, so not necessarily in order.)
        let mut discarded = src.discarded();
        discarded.sort();
        assert_eq!(discarded, strays);
        assert!(src.queue.lock().unwrap().is_empty() && r.drain().is_empty());
    }
}
