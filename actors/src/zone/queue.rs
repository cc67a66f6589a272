//! A ZoneActor's queue of claims waiting for a launch call: the claims called before (their
//! launch timeout runs from that call) first, in the order they came back, then the claims
//! waiting for their first call, in arrival order.

/// The queue. Calls take claims from its head.
#[derive(Debug, Default)]
pub(super) struct Queue {
    claims: Vec<String>,
    /// How many claims at the head were called before.
    ahead: usize,
}

impl Queue {
    pub(super) fn len(&self) -> usize {
        self.claims.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }

    /// Queues `claims`: after the other claims called before and ahead of those waiting for
    /// their first call when `called` (a call was made for them before), else at the back.
    pub(super) fn push(&mut self, claims: Vec<String>, called: bool) {
        if called {
            let at = self.ahead.min(self.claims.len());
            self.ahead = at + claims.len();
            self.claims.splice(at..at, claims);
        } else {
            self.claims.extend(claims);
        }
    }

    /// The first `n` claims (all of them when fewer), out of the queue.
    pub(super) fn take(&mut self, n: usize) -> Vec<String> {
        let n = n.min(self.claims.len());
        self.ahead = self.ahead.saturating_sub(n);
        self.claims.drain(..n).collect()
    }

    /// Every claim out of the queue.
    pub(super) fn clear(&mut self) {
        self.claims.clear();
        self.ahead = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::Queue;

    fn names(s: &[&str]) -> Vec<String> {
        s.iter().map(|c| (*c).to_string()).collect()
    }

    #[test]
    fn claims_called_before_go_ahead_of_the_others_in_the_order_they_came_back() {
        let mut q = Queue::default();
        q.push(names(&["a", "b", "c"]), false);
        q.push(names(&["x"]), true);
        q.push(names(&["d"]), false);
        q.push(names(&["y", "z"]), true);
        assert_eq!(q.take(2), names(&["x", "y"]));
        // Taking from the head takes from those called before first.
        q.push(names(&["w"]), true);
        assert_eq!(q.take(10), names(&["z", "w", "a", "b", "c", "d"]));
        assert!(q.is_empty());
        // Emptied, a claim called before is the head again, and the others follow it.
        q.push(names(&["e"]), false);
        q.push(names(&["v"]), true);
        assert_eq!((q.len(), q.take(1)), (2, names(&["v"])));
        assert_eq!(q.take(1), names(&["e"]));
    }

    #[test]
    fn a_take_past_the_claims_called_before_leaves_the_rest_in_arrival_order() {
        let mut q = Queue::default();
        q.push(names(&["x", "y"]), true);
        q.push(names(&["a", "b"]), false);
        assert_eq!(q.take(3), names(&["x", "y", "a"]));
        q.push(names(&["z"]), true);
        q.push(names(&["c"]), false);
        assert_eq!(q.take(3), names(&["z", "b", "c"]));
        q.push(names(&["a"]), false);
        q.clear();
        q.push(names(&["b"]), false);
        q.push(names(&["y"]), true);
        assert_eq!(q.take(2), names(&["y", "b"]));
    }
}
