// pskv-launch --launcher kubernetes: the manifests of a job.
//
// Kind "job" (any cluster): a Secret with the job secret; a headless Service
// `<name>-scheduler` (publishNotReadyAddresses, so the scheduler's DNS name resolves
// as soon as its pod runs); three Indexed Jobs — scheduler (1), servers (S), workers
// (N) — whose pods get the DMLC_* contract in their environment, DMLC_NODE_HOST from
// the pod IP, DMLC_TASK_ID from the completion index, and PSKV_JOB_SECRET from the
// Secret (valueFrom.secretKeyRef: the value is in no pod spec).
// Kind "mxjob" (clusters with Kubeflow's training operator): a Secret and one MXJob
// with Scheduler, Server and Worker replicas; the operator sets DMLC_* itself.
#pragma once

#include <string>

#include "launcher/launcher.h"

namespace pskv::launcher {

/// The manifests as one YAML stream. `reveal_secret`: the Secret carries the real
/// value (only for `kubectl apply` on stdin); otherwise it shows "<secret>".
std::string KubernetesManifests(const LaunchConfig& cfg, const std::string& job_id,
                                bool reveal_secret);

/// Prints the manifests (secret masked), or with cfg.k8s_apply pipes them to
/// `kubectl apply -f -` (`--dry-run=client` with --dry-run); returns the exit status.
int LaunchKubernetes(const LaunchConfig& cfg, const std::string& job_id);

}  // namespace pskv::launcher
