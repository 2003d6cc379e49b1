//! The blocking baseline: a bounded buffer guarded by a mutex, with condition variables to wait
//! on. This is the "shared memory grid with locks" design alternative of the response layer,
//! written the way it is usually written (`notify_one` after every change), so experiments can
//! measure what the lock-free ring saves. It ignores the configured [`WaitStrategy`]: a blocked
//! side always sleeps on a condition variable.
//!
//! Batches are copied in and out under the lock; the consumer's callback runs after the lock is
//! released (a pre-allocated scratch buffer holds the batch), so a slow handler does not block
//! the producer.
//!
//! [`WaitStrategy`]: crate::WaitStrategy

use crate::ring::{BatchError, Disconnected, RingConfig, RingError};
use crate::sync::{Arc, Condvar, Mutex, MutexGuard, lock};
use crate::wait::Parker;

struct State<T> {
    slots: Box<[T]>,
    head: usize,
    len: usize,
    producer_alive: bool,
    consumer_alive: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    not_empty: Condvar,
    not_full: Condvar,
    /// Also woken on push, for a fan-in consumer that polls several connectors.
    consumer_parker: Arc<Parker>,
    /// Also woken on pop, for a fan-out producer that waits on several connectors.
    producer_parker: Arc<Parker>,
}

pub struct Producer<T> {
    shared: Arc<Shared<T>>,
    batch_slots_max: usize,
}

pub struct Consumer<T> {
    shared: Arc<Shared<T>>,
    batch_slots_max: usize,
    scratch: Vec<T>,
}

/// Builds the blocking baseline with the same bounds as the lock-free ring.
pub fn bounded<T: Copy + Default + Send>(
    config: &RingConfig,
    producer_parker: Arc<Parker>,
    consumer_parker: Arc<Parker>,
) -> Result<(Producer<T>, Consumer<T>), RingError> {
    config.validate()?;
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            slots: vec![T::default(); config.capacity_slots].into_boxed_slice(),
            head: 0,
            len: 0,
            producer_alive: true,
            consumer_alive: true,
        }),
        not_empty: Condvar::new(),
        not_full: Condvar::new(),
        consumer_parker,
        producer_parker,
    });
    let producer = Producer { shared: shared.clone(), batch_slots_max: config.batch_slots_max };
    let consumer = Consumer {
        shared,
        batch_slots_max: config.batch_slots_max,
        scratch: Vec::with_capacity(config.batch_slots_max),
    };
    Ok((producer, consumer))
}

fn wait<'a, T>(condvar: &Condvar, guard: MutexGuard<'a, State<T>>) -> MutexGuard<'a, State<T>> {
    condvar.wait(guard).unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<T: Copy> Producer<T> {
    pub fn try_write_batch(
        &mut self,
        n: usize,
        mut fill: impl FnMut(usize, &mut T),
    ) -> Result<(), BatchError> {
        if n > self.batch_slots_max {
            return Err(BatchError::TooLarge { requested: n, max: self.batch_slots_max });
        }
        {
            let mut state = lock(&self.shared.state);
            if !state.consumer_alive {
                return Err(BatchError::Disconnected);
            }
            let capacity = state.slots.len();
            if capacity - state.len < n {
                return Err(BatchError::Full);
            }
            for i in 0..n {
                let index = (state.head + state.len + i) % capacity;
                fill(i, &mut state.slots[index]);
            }
            state.len += n;
        }
        self.shared.not_empty.notify_one();
        self.shared.consumer_parker.notify();
        Ok(())
    }

    /// Copies `items` in, waiting on the condition variable while the buffer is full.
    pub fn push_batch(&mut self, items: &[T]) -> Result<(), Disconnected> {
        let mut rest = items;
        while !rest.is_empty() {
            {
                let mut state = lock(&self.shared.state);
                let capacity = state.slots.len();
                while state.len == capacity && state.consumer_alive {
                    state = wait(&self.shared.not_full, state);
                }
                if !state.consumer_alive {
                    return Err(Disconnected);
                }
                let chunk = rest.len().min(self.batch_slots_max).min(capacity - state.len);
                for (i, item) in rest[..chunk].iter().enumerate() {
                    let index = (state.head + state.len + i) % capacity;
                    state.slots[index] = *item;
                }
                state.len += chunk;
                rest = &rest[chunk..];
            }
            self.shared.not_empty.notify_one();
            self.shared.consumer_parker.notify();
        }
        Ok(())
    }
}

impl<T> Drop for Producer<T> {
    fn drop(&mut self) {
        lock(&self.shared.state).producer_alive = false;
        self.shared.not_empty.notify_all();
        self.shared.consumer_parker.notify();
    }
}

impl<T: Copy> Consumer<T> {
    pub fn len(&self) -> usize {
        lock(&self.shared.state).len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_disconnected(&mut self) -> bool {
        let state = lock(&self.shared.state);
        !state.producer_alive && state.len == 0
    }

    /// Copies up to `max` messages out under the lock, then calls `f` on them without it.
    pub fn read_batch(&mut self, max: usize, f: impl FnMut(&T)) -> usize {
        let state = lock(&self.shared.state);
        take_locked(&self.shared, state, &mut self.scratch, max.min(self.batch_slots_max), f)
    }

    /// Waits on the condition variable until a message arrives or the producer is gone.
    pub fn wait_read_batch(
        &mut self,
        max: usize,
        f: impl FnMut(&T),
    ) -> Result<usize, Disconnected> {
        assert!(max > 0, "wait_read_batch needs max >= 1 to make progress");
        let mut state = lock(&self.shared.state);
        while state.len == 0 && state.producer_alive {
            state = wait(&self.shared.not_empty, state);
        }
        if state.len == 0 {
            return Err(Disconnected);
        }
        Ok(take_locked(&self.shared, state, &mut self.scratch, max.min(self.batch_slots_max), f))
    }
}

/// Copies up to `max` messages into `scratch` under the lock, releases the lock and the
/// waiting producer, then calls `f` on each copy.
fn take_locked<T: Copy>(
    shared: &Shared<T>,
    mut state: MutexGuard<'_, State<T>>,
    scratch: &mut Vec<T>,
    max: usize,
    f: impl FnMut(&T),
) -> usize {
    let n = state.len.min(max);
    if n == 0 {
        return 0;
    }
    let capacity = state.slots.len();
    scratch.clear();
    for i in 0..n {
        scratch.push(state.slots[(state.head + i) % capacity]);
    }
    state.head = (state.head + n) % capacity;
    state.len -= n;
    drop(state);
    shared.not_full.notify_one();
    shared.producer_parker.notify();
    scratch.iter().for_each(f);
    n
}

impl<T> Drop for Consumer<T> {
    fn drop(&mut self) {
        lock(&self.shared.state).consumer_alive = false;
        self.shared.not_full.notify_all();
        self.shared.producer_parker.notify();
    }
}
