//! The sim cloud's interruption queue: SQS semantics in memory (at most 10 per receive,
//! visibility timeout, at-least-once, idempotent delete), cheap at tens of thousands of
//! messages.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{BoxFuture, CloudError, InterruptionQueue, QueueMessage};
use dovetail_core::clock::Clock;

struct Message {
    body: String,
    /// Its entry in `State::order`: (visible at, sequence).
    key: (Duration, u64),
    /// Receipt handle of the last receive.
    receipt: Option<String>,
    receives: u64,
    /// When it was sent, ms on the clock.
    sent: u64,
}

#[derive(Default)]
struct State {
    messages: HashMap<String, Message>,
    /// (visible at, sequence) -> message id: visible messages in order.
    order: BTreeMap<(Duration, u64), String>,
    next: u64,
}

/// An in-memory queue on an injected clock.
pub struct SimQueue {
    clock: Arc<dyn Clock>,
    visibility: Duration,
    state: Mutex<State>,
}

impl SimQueue {
    /// A queue whose received messages stay hidden for `visibility`.
    pub fn new(clock: Arc<dyn Clock>, visibility: Duration) -> Self {
        SimQueue { clock, visibility, state: Mutex::new(State::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Enqueues a message body; returns its id.
    pub fn send(&self, body: String) -> String {
        let now = self.clock.now();
        let mut s = self.lock();
        s.next += 1;
        let id = format!("msg-{:08}", s.next);
        let seq = s.next;
        s.order.insert((now, seq), id.clone());
        let sent = u64::try_from(now.as_millis()).unwrap_or(u64::MAX);
        s.messages.insert(id.clone(), Message { body, key: (now, seq), receipt: None, receives: 0, sent });
        id
    }

    /// Takes every message out (visible or not), oldest first: their bodies. For forwarding
    /// what the sim's EC2 sends to another queue.
    pub fn take_all(&self) -> Vec<String> {
        let mut s = self.lock();
        s.order.clear();
        let mut all: Vec<((u64, u64), String)> =
            std::mem::take(&mut s.messages).into_values().map(|m| ((m.sent, m.key.1), m.body)).collect();
        all.sort_by_key(|(at, _)| *at);
        all.into_iter().map(|(_, b)| b).collect()
    }

    /// Messages in the queue (visible or not).
    pub fn len(&self) -> usize {
        self.lock().messages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn hide(s: &mut State, id: &str, until: Duration) {
        s.next += 1;
        let key = (until, s.next);
        let Some(m) = s.messages.get_mut(id) else { return };
        let old = std::mem::replace(&mut m.key, key);
        s.order.remove(&old);
        s.order.insert(key, id.to_string());
    }
}

impl InterruptionQueue for SimQueue {
    fn receive(&self, max: usize, _wait: Duration) -> BoxFuture<'_, Result<Vec<QueueMessage>, CloudError>> {
        Box::pin(async move {
            let now = self.clock.now();
            let until = now + self.visibility;
            let mut s = self.lock();
            let due: Vec<((Duration, u64), String)> =
                s.order.range(..=(now, u64::MAX)).take(max.min(10)).map(|(k, v)| (*k, v.clone())).collect();
            let mut out = Vec::with_capacity(due.len());
            for (_, id) in due {
                SimQueue::hide(&mut s, &id, until);
                let Some(m) = s.messages.get_mut(&id) else { continue };
                m.receives += 1;
                let receipt = format!("{id}#{}", m.receives);
                m.receipt = Some(receipt.clone());
                out.push(QueueMessage { id, receipt, body: m.body.clone(), sent: Some(m.sent) });
            }
            Ok(out)
        })
    }

    fn delete<'a>(&'a self, receipts: &'a [String]) -> BoxFuture<'a, Result<(), CloudError>> {
        Box::pin(async move {
            let mut s = self.lock();
            for r in receipts {
                let Some(id) = r.split('#').next() else { continue };
                let current = s.messages.get(id).is_some_and(|m| m.receipt.as_deref() == Some(r.as_str()));
                if current && let Some(m) = s.messages.remove(id) {
                    s.order.remove(&m.key);
                }
            }
            Ok(())
        })
    }

    fn change_visibility<'a>(&'a self, receipt: &'a str, timeout: Duration) -> BoxFuture<'a, Result<(), CloudError>> {
        Box::pin(async move {
            let now = self.clock.now();
            let mut s = self.lock();
            let id = receipt.split('#').next().unwrap_or_default().to_string();
            let current = s.messages.get(&id).is_some_and(|m| m.receipt.as_deref() == Some(receipt));
            if !current {
                return Err(CloudError::Invalid {
                    what: "receipt handle".into(),
                    reason: format!("{receipt} is not the message's current receipt"),
                });
            }
            SimQueue::hide(&mut s, &id, now + timeout);
            Ok(())
        })
    }
}
