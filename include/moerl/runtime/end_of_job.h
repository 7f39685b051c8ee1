#pragma once
// The deadlines of a job's last minutes, in one place because two roles must
// agree on them: after its last step a learner waits for the training
// episodes it handed out (drain), and only then does learner 0 close the
// weight publication that every finished actor is still waiting on. An
// actor's wait must outlast learner 0's drain, or a slow drain (another
// actor's long episode) would end the job from the actor's side.

namespace moerl::runtime {

// A learner's wait, after its last step, for the episodes handed out for it.
inline double drain_limit_s(double message_timeout_s) { return 10 * message_timeout_s; }

// A finished actor's wait for learner 0 to close the weight publication:
// learner 0's drain, then its last publication and the close itself.
inline double publication_close_wait_s(double message_timeout_s) {
  return drain_limit_s(message_timeout_s) + 2 * message_timeout_s;
}

}  // namespace moerl::runtime
