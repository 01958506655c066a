/* An admission policy's waiting queue: sim/scheduler/queue.py's WaitingQueue (its
 * specification) on the same arrays -- a binary min-heap of request ids by rank, admitted
 * requests dropped when they reach the top, and the age limit's oldest request first. */
#include "stepper.h"

static int before(const Stepper *self, int64_t a, int64_t b) {
    return self->rank[self->heap[a]] < self->rank[self->heap[b]];
}

static void swap(Stepper *self, int64_t a, int64_t b) {
    int64_t held = self->heap[a];
    self->heap[a] = self->heap[b];
    self->heap[b] = held;
}

static void push(Stepper *self, int64_t request) {
    int64_t index = self->counters[QUEUED]++;
    self->heap[index] = request;
    while (index > 0 && before(self, index, (index - 1) / 2)) {
        swap(self, index, (index - 1) / 2);
        index = (index - 1) / 2;
    }
}

static void pop(Stepper *self) {
    int64_t size = --self->counters[QUEUED], index = 0;
    self->heap[0] = self->heap[size];
    for (;;) {
        int64_t smallest = index;
        for (int64_t child = 2 * index + 1; child <= 2 * index + 2; child++) {
            if (child < size && before(self, child, smallest)) {
                smallest = child;
            }
        }
        if (smallest == index) {
            return;
        }
        swap(self, index, smallest);
        index = smallest;
    }
}

/* WaitingQueue.first: the request to admit next at ``now`` among the first ``arrived``;
 * -1 when none waits. */
int64_t queue_first(Stepper *self, double now, int64_t arrived) {
    int64_t *counters = self->counters;
    for (int64_t request = counters[PUSHED]; request < arrived; request++) {
        push(self, request);
    }
    if (arrived > counters[PUSHED]) {
        counters[PUSHED] = arrived;
    }
    int64_t oldest = counters[NEXT_ADMIT];
    while (oldest < arrived && self->admitted[oldest]) {
        oldest++;
    }
    counters[NEXT_ADMIT] = oldest;
    if (oldest < arrived && now - self->arrival[oldest] > self->age_limit) {
        return oldest;
    }
    while (counters[QUEUED] && self->admitted[self->heap[0]]) {
        pop(self);
    }
    return counters[QUEUED] ? self->heap[0] : -1;
}

/* WaitingQueue.take */
void queue_take(Stepper *self, int64_t request) {
    self->admitted[request] = 1;
    self->counters[ADMITTED] += 1;
}
