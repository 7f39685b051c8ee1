#pragma once
// The typed, immutable-after-load sections of a run configuration. Defaults
// here are the documented defaults; the schema in src/config/schema_*.cpp
// binds each member to its TOML key, documentation and valid range, and
// `moerl config reference` prints that table (docs/config.md is generated
// from it).

#include <cstdint>
#include <map>
#include <limits>
#include <string>
#include <vector>

namespace moerl::config {

// Where learners and actors compute ([run] device); env workers always run on
// the CPU. "cuda": each rank takes cuda:(local rank % visible devices).
enum class RunDevice { Cpu, Cuda };
// The compute dtype of the policy ([run] dtype). Learners keep float32 master
// weights and optimizer state and compute in it; actors hold their weights in it.
enum class RunDtype { Float32, BFloat16 };
// Which backend the learners' gradient all-reduce and the weight broadcast
// may use: NCCL where the group allows it (comm/group_backend.h), or MPI always.
enum class RunCollectives { Auto, Mpi };

// [run]: identity and placement of one run.
struct RunSection {
  std::string name = "moerl";       // run name; the run directory is output_dir/name
  std::string output_dir = "runs";  // where run directories are created
  std::int64_t seed = 1;            // global seed; every rank derives its own from it
  bool deterministic = false;       // trade speed for bitwise reproducibility
  RunDevice device = RunDevice::Cpu;
  RunDtype dtype = RunDtype::Float32;
  RunCollectives collectives = RunCollectives::Auto;
};

// [cluster]: how many ranks take each role. Ranks are laid out in this order:
// learners [0, L), actors [L, L+A), env workers [L+A, L+A+E), standby actors
// after them. The sum must equal the MPI world size.
// Which process takes which rank: the launcher's order, or learners on the
// training hosts and every other role on the inference hosts.
enum class Placement { RankOrder, HostGroups };

struct ClusterSection {
  std::int64_t learners = 1;
  std::int64_t actors = 1;
  std::int64_t env_workers = 1;
  std::int64_t standby_actors = 0;
  std::int64_t threads_per_rank = 0;         // compute threads; 0 = cores / ranks on this host
  std::int64_t expert_parallel = 1;          // learners per expert group (routed experts split over them)
  double message_timeout_s = 60.0;           // longest wait for any expected message
  double shutdown_timeout_s = 10.0;          // how long a clean stop may take before abort
  std::int64_t malformed_message_limit = 5;  // malformed messages from one rank before the job stops
  double heartbeat_interval_s = 1.0;         // every rank tells learner 0 it is alive this often
  double heartbeat_timeout_s = 10.0;         // a rank silent this long is declared lost
  Placement placement = Placement::RankOrder;
  std::vector<std::string> training_hosts;   // host name patterns (glob) of the learners' hosts
  std::vector<std::string> inference_hosts;  // of the other roles' hosts; empty = every other host
};

// QK-norm variants: per head over head_dim (Qwen3-MoE), or over the whole
// projection of all heads (OLMoE).
enum class QkNorm { None, PerHead, Full };

// [model]: the decoder-only transformer. Sizes default to a small model that
// trains on a CPU.
struct ModelSection {
  std::int64_t vocab_size = 264;  // byte tokenizer: 256 bytes + 8 special tokens
  std::int64_t d_model = 128;
  std::int64_t num_layers = 2;
  std::int64_t num_heads = 4;
  std::int64_t num_kv_heads = 2;  // grouped-query attention; divides num_heads
  std::int64_t d_ff = 256;        // SwiGLU hidden size of dense layers
  std::int64_t max_seq_len = 1024;
  double rope_theta = 10000.0;
  double norm_eps = 1e-6;
  bool tie_embeddings = false;
  double init_std = 0.02;
  // Architecture features of imported Hugging Face models (src/hf/); the
  // defaults are the built-in model's.
  std::string source = "";          // "" = built-in; "hf:DIR" = config.json + safetensors in DIR
  std::int64_t head_dim = 0;        // 0 = d_model / num_heads
  QkNorm qk_norm = QkNorm::None;    // RMSNorm on queries and keys before rotary
  bool qkv_bias = false;            // biases on q_proj, k_proj, v_proj (Qwen2-MoE)
  bool o_bias = false;              // bias on o_proj
  std::int64_t sliding_window = 0;  // 0 = full causal attention; else keys within this many positions
};

enum class ChatLayoutPreset { Auto, Byte, ChatMl, Llama3 };

// [chat]: how multi-turn episodes become tokens (text/episode_format.h).
// The string keys override the preset's field of the same name in
// text::ChatLayout; "" keeps the preset's.
struct ChatSection {
  ChatLayoutPreset layout = ChatLayoutPreset::Auto;  // auto: byte for the built-in model, chatml for hf:
  std::string tokenizer = "";                        // tokenizer.json; "" = DIR/tokenizer.json of source = "hf:DIR"
  std::string begin = "";                            // written once before the first message
  std::string message = "";                          // template with {role} and {content}
  std::string end_of_turn = "";                      // one token; follows {content} in `message`
  std::string system_role = "";
  std::string user_role = "";
  std::string assistant_role = "";
};

enum class RouterMode { SoftmaxThenTopK, TopKThenSoftmax };

// [moe]: the mixture-of-experts feed-forward layers.
struct MoeSection {
  bool enabled = true;                  // false: every layer is a dense SwiGLU
  std::int64_t num_experts = 8;         // routed experts per MoE layer
  std::int64_t top_k = 2;               // experts active per token
  std::int64_t d_expert = 128;          // SwiGLU hidden size of one expert
  std::int64_t shared_experts = 0;      // always-active experts added to the routed ones
  std::int64_t first_dense_layers = 0;  // leading layers that stay dense
  RouterMode router = RouterMode::SoftmaxThenTopK;
  bool renormalize = true;           // gates over the chosen k sum to 1
  double aux_loss_weight = 0.01;     // Switch/GShard load-balancing loss
  double z_loss_weight = 0.001;      // router z-loss
  double capacity_factor = 0.0;      // 0 = dropless; else per-expert capacity factor
  std::int64_t block_size = 1;       // pad each expert's segment to a multiple of this
  std::int64_t d_shared_expert = 0;  // hidden size of the shared expert; 0 = shared_experts * d_expert
  bool shared_expert_gate = false;   // sigmoid(x . w) scales the shared expert's output (Qwen2-MoE)
  std::int64_t sparse_step = 1;      // after the dense prefix, layer l is MoE when (l + 1) % sparse_step == 0
};

enum class LogLevel { Trace, Debug, Info, Warn, Error };

// [telemetry]: logs and metrics.
struct TelemetrySection {
  LogLevel log_level = LogLevel::Info;
  bool per_rank_log_files = false;             // also write <run dir>/logs/rank-N.log
  std::string metrics_file = "metrics.jsonl";  // JSON lines, one per step, in the run dir
  double metrics_interval_s = 5.0;             // how often ranks report metrics to learner 0
  std::int64_t prometheus_port = 0;            // learner 0 serves /metrics here; 0 = off
  std::string prometheus_bind = "127.0.0.1";   // the address it listens on
  double imbalance_warn_ratio = 2.0;           // log a warning when a layer's max/mean expert load passes this
  double env_p99_warn_s = 0.5;                 // ... or when a family's environment step P99 passes this
};

// [eval]: held-out evaluation during training, acceptance and rollback.
struct EvalSection {
  std::int64_t every_steps = 0;     // evaluate every N learner steps during training; 0 = off
  std::int64_t episodes = 0;        // held-out episodes per family in those; 0 = rollout.eval_episodes
  bool auto_rollback = false;       // return to the `stable` checkpoint after rollback_after regressions
  std::int64_t rollback_after = 2;  // consecutive evaluations regressed beyond their interval
};

enum class Shaping { Sparse, Shaped };
enum class ShapingChoice { Inherit, Sparse, Shaped };

// [env]: the environment workers and the task mix they serve.
struct EnvSection {
  std::vector<std::string> families = {"arithmetic", "maze", "guess", "sort", "lookup"};
  std::int64_t difficulty = 1;            // default difficulty of new sessions
  Shaping shaping = Shaping::Sparse;      // default reward shaping
  std::int64_t max_turns = 0;             // default step budget; 0 = each family's own
  std::int64_t sessions_per_worker = 64;  // live sessions one env worker hosts at most
  std::int64_t threads = 0;               // threads stepping sessions; 0 = the rank's compute threads
  double timeout_s = 10.0;                // per-step timeout
  std::int64_t max_retries = 2;           // retries of a failed or timed-out step
  double retry_backoff_s = 0.1;           // pause before the first retry; doubles each retry
  std::string archive_dir = "";           // session snapshots; "" = <run dir>/archive/env
  double reward_min = -std::numeric_limits<double>::infinity();  // rewards outside [min, max] fail the attempt
  double reward_max = std::numeric_limits<double>::infinity();
  std::int64_t breaker_failures = 8;      // consecutive failed sessions of a family that pause it; 0 = never
  std::int64_t snapshot_every_turns = 4;  // a session's snapshot goes to the archive this often; 0 = never
  double breaker_cooldown_s = 60.0;       // a paused family is drawn from again after this long
  bool curriculum = false;                // training difficulty per family follows its recent success
  // Training episodes at a level that decide the next move. A group's
  // episodes share one task, so the sample holds window / group_size tasks:
  // 32 (4 tasks at groups of 8) read a family at 40% as 25% or less often
  // enough to send it down and up again every few steps.
  std::int64_t curriculum_window = 64;
  double curriculum_raise_at = 0.75;           // success over the window that raises the level
  double curriculum_lower_at = 0.25;           // success over the window that lowers it
  std::int64_t curriculum_max_difficulty = 0;  // highest level; 0 = each family's own
  bool adaptive_weights = false;               // families drawn by learning progress (times their weight)
};

// [env.<family>]: per-family overrides of [env] (0 / "inherit" = use [env]).
struct EnvFamilySection {
  std::int64_t difficulty = 0;
  ShapingChoice shaping = ShapingChoice::Inherit;
  std::int64_t max_turns = 0;
  double weight = 1.0;  // share of new sessions drawn from this family
};

// Every [env.<family>] section, by family name (built-in families and "external").
using EnvFamilySections = std::map<std::string, EnvFamilySection>;

// [env.external]: the external-process family (JSON lines over stdin/stdout).
struct ExternalEnvSection {
  std::string command = "";         // shell command that starts one environment process
  double startup_timeout_s = 10.0;  // the process must answer its first request by then
};

// How actors store the KV cache ([rollout] kv_cache_dtype).
enum class KvCacheStorage { Float32, Int8 };
// What an actor does when an episode's next turn would not fit its context budget.
enum class ContextBudgetPolicy { EndEpisode, DropOldestTurns };

// [rollout]: generation on the actors.
struct RolloutSection {
  std::int64_t sessions_per_actor = 16;  // episodes an actor drives at once (the decode batch)
  double temperature = 1.0;
  double top_p = 1.0;
  std::int64_t top_k = 0;            // token sampling top-k; 0 = off
  std::int64_t moe_top_k = 0;        // MoE experts per token while generating; 0 = moe.top_k
  std::int64_t expert_parallel = 1;  // actors per expert group (routed experts split over them)
  std::int64_t max_tokens_per_turn = 24;
  std::int64_t max_tokens_per_episode = 768;                // context budget of one episode
  std::int64_t group_size = 4;                              // G samples per task seed (GRPO groups)
  std::int64_t eval_episodes = 16;                          // held-out episodes per family, before and after training
  double eval_temperature = 0.0;                            // 0 = greedy evaluation
  bool eval_greedy = true;                                  // also play each held-out seed at temperature 0
  KvCacheStorage kv_cache_dtype = KvCacheStorage::Float32;  // int8: per-head, per-token scales
  ContextBudgetPolicy context_policy = ContextBudgetPolicy::EndEpisode;
};

enum class AdvantageEstimator { Grpo, DrGrpo, Rloo, Ppo };
enum class LossNormalization { Token, Sequence, Constant };
enum class CreditAssignment { Episode, Turn };
enum class KlMode { None, K1, K3 };

// [algo]: the RL objective.
struct AlgoSection {
  AdvantageEstimator advantage = AdvantageEstimator::Grpo;
  CreditAssignment credit = CreditAssignment::Episode;  // turn: process-reward GRPO over each turn's reward
  bool gspo = false;                                    // sequence-level ratio and clipping (recommended for MoE)
  double clip_low = 0.2;
  double clip_high = 0.28;  // clip-higher (DAPO)
  LossNormalization normalization = LossNormalization::Token;
  double importance_cap = 2.0;  // truncated importance weight C (decoupled PPO)
  KlMode kl = KlMode::None;
  double kl_coef = 0.0;
  double entropy_coef = 0.0;
  bool drop_zero_variance_groups = true;     // dynamic sampling
  bool routing_replay = true;                // learner replays the actor's routing
  std::int64_t groups_per_step = 8;          // GRPO groups per learner step (over all learners)
  std::int64_t overlong_cache_tokens = 0;    // DAPO soft overlong penalty ramp width; 0 = off
  double overlong_factor = 1.0;              // penalty at the episode budget
  std::int64_t routing_check_interval = 10;  // steps between router-disagreement measurements; 0 = never
  // PPO (advantage = "ppo"): a learned value head and GAE over turns.
  double gae_gamma = 1.0;  // discount per turn
  double gae_lambda = 0.95;
  double value_coef = 0.5;        // weight of the value loss
  double value_clip = 0.2;        // PPO2 value clipping; 0 = unclipped
  double value_lr_scale = 10.0;   // value head lr = [optim] lr * this
  bool whiten_advantages = true;  // per-turn advantages to zero mean, unit std per micro-batch
};

// [optim]: the optimizer of learners (and of pretraining).
struct OptimSection {
  double lr = 1e-4;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double grad_clip = 1.0;
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 100;  // RL steps of a run
  bool cosine = false;             // cosine decay to 10% after warm-up
  std::int64_t grad_accumulation = 1;
  double gradient_bucket_mb = 4.0;  // learners' all-reduce buckets overlapping the backward; 0 = one after it
};

// [sync]: weight publication from learner 0 to the actors.
struct SyncSection {
  std::int64_t interval = 1;       // learner steps between publications
  std::int64_t max_staleness = 1;  // oldest trained-on version = current - max_staleness
  std::int64_t bucket_mb = 4;
  bool asynchronous = true;  // false: generate, then train, then sync
};

// [checkpoint]: versioned HDF5 checkpoints of the learner.
struct CheckpointSection {
  std::int64_t every_steps = 20;       // 0 = only at the end and on a stop signal
  std::int64_t keep_last = 3;          // retention: the last K plus every tagged version
  std::string directory = "";          // "" = <run dir>/checkpoints
  bool save_on_stop = true;            // SIGTERM/SIGINT: write a final checkpoint before exiting
  double every_minutes = 0.0;          // also save when this much time passed since the last save; 0 = off
  std::string archive_directory = "";  // copies of checkpoints, env snapshots, metrics; "" = off
  std::int64_t archive_keep_last = 0;  // versions kept in the archive (plus tagged ones); 0 = all
  double archive_wait_s = 600.0;       // at exit, how long the job waits for archive copies to finish
};

// [pretrain]: supervised warm-up on the scripted experts' demonstrations.
struct PretrainSection {
  std::int64_t episodes = 2000;
  double expert_error_rate = 0.25;
  // Each demonstration is played at its family's difficulty or up to this
  // many levels below it (uniformly): a base that also knows the easier
  // levels gives an [env] curriculum somewhere to start.
  std::int64_t easier_levels = 0;
  // An optional first stage on some families alone, before `steps` on the
  // whole mix: a skill that takes long to appear (lookup's copying of keys)
  // does not appear from its share of a mixed budget.
  std::vector<std::string> first_stage_families;
  std::int64_t first_stage_steps = 0;
  std::int64_t steps = 300;
  std::int64_t batch_episodes = 16;
  double lr = 1e-3;
  std::int64_t warmup_steps = 0;
  bool cosine = false;      // decay to 10% of lr at the last step
  std::string output = "";  // checkpoint file; "" = <run dir>/base.pt
};

// Where a learner's checkpoint save is killed ([faults] checkpoint_crash_point).
enum class CheckpointCrashPoint { None, AfterArrays, BeforeRename, BeforeIndex, BeforeLatest };

// [faults]: deliberate failures, for testing that the job survives or stops
// cleanly. All off by default; never set them in production configs.
struct FaultsSection {
  std::int64_t fail_rank = -1;          // this rank raises a fatal error once roles are assigned
  std::int64_t hang_rank = -1;          // this rank stops answering messages (it sleeps)
  double env_hang_rate = 0.0;           // probability that an env step attempt hangs
  double env_hang_s = 30.0;             // how long an injected hang lasts
  double env_crash_rate = 0.0;          // probability that an env step attempt crashes
  std::int64_t env_fault_attempts = 1;  // faults hit only the first N attempts of a step
  std::int64_t env_fault_seed = 0;      // which steps are hit is a function of this seed
  CheckpointCrashPoint checkpoint_crash_point = CheckpointCrashPoint::None;  // learner 0 _exit()s mid-save
  std::int64_t checkpoint_crash_version = -1;  // the save of this policy version crashes; -1 = the first save
  std::vector<std::string> plan;               // faults of a real run, in words (config/fault_plan.h)
};

}  // namespace moerl::config
