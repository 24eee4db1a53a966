#include "launcher/plans/kubernetes.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "common/env_table.h"
#include "launcher/process.h"
#include "pskv/error.h"

namespace pskv::launcher {

namespace {

// A small YAML tree, emitted in block style; every string scalar double-quoted
// (JSON escaping is valid YAML), so no value can change the document's structure.
struct Y {
  enum Kind { kStr, kNum, kBool, kMap, kList } kind = kMap;
  std::string s;
  std::vector<std::pair<std::string, Y>> map;
  std::vector<Y> list;

  static Y Str(std::string v) {
    Y y;
    y.kind = kStr;
    y.s = std::move(v);
    return y;
  }
  static Y Num(long v) {
    Y y;
    y.kind = kNum;
    y.s = std::to_string(v);
    return y;
  }
  static Y Bool(bool v) {
    Y y;
    y.kind = kBool;
    y.s = v ? "true" : "false";
    return y;
  }
  static Y List() {
    Y y;
    y.kind = kList;
    return y;
  }
  Y& operator()(const std::string& k, Y v) {
    map.emplace_back(k, std::move(v));
    return *this;
  }
  Y& operator()(const std::string& k, const char* v) { return (*this)(k, Str(v)); }
  Y& operator()(const std::string& k, const std::string& v) { return (*this)(k, Str(v)); }
  Y& Add(Y v) {
    list.push_back(std::move(v));
    return *this;
  }
  bool Scalar() const { return kind == kStr || kind == kNum || kind == kBool; }
};

std::string Quote(const std::string& s) {
  std::string q = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      q += '\\';
      q += static_cast<char>(c);
    } else if (c == '\n') {
      q += "\\n";
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      q += buf;
    } else {
      q += static_cast<char>(c);
    }
  }
  return q + "\"";
}

std::string ScalarText(const Y& y) {
  return y.kind == Y::kStr ? Quote(y.s) : y.s;
}

void Emit(const Y& y, int indent, std::string& out) {
  const std::string pad(static_cast<size_t>(indent), ' ');
  if (y.kind == Y::kMap) {
    for (auto& [k, v] : y.map) {
      if (v.Scalar()) {
        out += pad + k + ": " + ScalarText(v) + "\n";
      } else if ((v.kind == Y::kMap && v.map.empty()) || (v.kind == Y::kList && v.list.empty())) {
        out += pad + k + (v.kind == Y::kMap ? ": {}\n" : ": []\n");
      } else {
        out += pad + k + ":\n";
        Emit(v, v.kind == Y::kList ? indent : indent + 2, out);
      }
    }
  } else if (y.kind == Y::kList) {
    for (auto& v : y.list) {
      if (v.Scalar()) {
        out += pad + "- " + ScalarText(v) + "\n";
      } else {
        std::string inner;
        Emit(v, indent + 2, inner);
        // "- " replaces the first item's indentation
        out += pad + "- " + inner.substr(static_cast<size_t>(indent) + 2);
      }
    }
  }
}

std::string Document(const Y& y) {
  std::string out = "---\n";
  Emit(y, 0, out);
  return out;
}

// Kubernetes object names: lowercase alphanumerics and '-', at most 63 characters.
std::string CheckName(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 52 &&
            std::isalnum(static_cast<unsigned char>(name[0])) &&
            std::isalnum(static_cast<unsigned char>(name.back()));
  for (char c : name)
    ok &= (std::islower(static_cast<unsigned char>(c)) ||
           std::isdigit(static_cast<unsigned char>(c)) || c == '-');
  if (!ok)
    throw InvalidArgument(
        "--job-name '" + name +
        "' is not a Kubernetes name: lowercase letters, digits and '-', at most 52 "
        "characters, starting and ending with a letter or digit");
  return name;
}

Y EnvVar(const std::string& k, const std::string& v) {
  return Y()("name", k)("value", v);
}

Y FieldEnv(const std::string& k, const std::string& path) {
  return Y()("name", k)("valueFrom", Y()("fieldRef", Y()("fieldPath", path)));
}

Y SecretEnv(const std::string& secret_name) {
  return Y()("name", "PSKV_JOB_SECRET")(
      "valueFrom", Y()("secretKeyRef", Y()("name", secret_name)("key", "PSKV_JOB_SECRET")));
}

Y Resources(const LaunchConfig& cfg) {
  Y r;
  if (!cfg.k8s_cpu.empty()) r("cpu", cfg.k8s_cpu);
  if (!cfg.k8s_memory.empty()) r("memory", cfg.k8s_memory);
  return Y()("requests", r)("limits", r);
}

Y Command(const std::vector<std::string>& argv) {
  Y l = Y::List();
  for (auto& a : argv) l.Add(Y::Str(a));
  return l;
}

// Settings the launcher forwards from its own environment into pods: the job-wide
// ones, not those about the launcher's hosts (paths, NIC names: common/env_table.h).
bool Forwarded(const std::string& k) {
  const pskv::EnvVar* v = pskv::FindEnvVar(k);
  return v && v->scope == pskv::EnvScope::kJob;
}

// One job's objects, built from the launch configuration: the names every object shares
// and one method per kind of object.
class Manifests {
 public:
  Manifests(const LaunchConfig& cfg, const std::string& job_id)
      : cfg_(cfg),
        job_id_(job_id),
        name_(CheckName(cfg.k8s_job_name.empty() ? "pskv-" + job_id : cfg.k8s_job_name)),
        ns_(cfg.k8s_namespace),
        secret_name_(name_ + "-secret"),
        svc_(name_ + "-scheduler"),
        port_(cfg.root_port ? cfg.root_port : 9091),  // MXJob's default port
        mxjob_(cfg.k8s_kind == "mxjob"),
        server_argv_(cfg.server_command.empty()
                         ? std::vector<std::string>{"pskv-server"}
                         : std::vector<std::string>{"/bin/sh", "-c", cfg.server_command}) {}

  std::string Text(bool reveal_secret) const {
    std::string out;
    // The secret: the only object with its value; pods reference it.
    if (!cfg_.job_secret.empty()) out += Document(Secret(reveal_secret));
    if (mxjob_) return out + Document(MxJob());
    out += Document(Service());
    for (auto [role, count] : {std::pair<std::string, int>{"scheduler", 1},
                               {"server", cfg_.num_servers},
                               {"worker", cfg_.num_workers}})
      out += Document(IndexedJob(role, count));
    return out;
  }

 private:
  Y Labels(const std::string& role) const {
    Y l;
    l("app.kubernetes.io/name", "pskv")("app.kubernetes.io/instance", name_)("pskv/job", name_);
    if (!role.empty()) l("pskv/role", role);
    return l;
  }

  Y Meta(const std::string& obj, const std::string& role) const {
    return Y()("name", obj)("namespace", ns_)("labels", Labels(role));
  }

  Y Secret(bool reveal_secret) const {
    Y secret;
    secret("apiVersion", "v1")("kind", "Secret")("metadata", Meta(secret_name_, ""))(
        "type", "Opaque")("stringData",
                          Y()("PSKV_JOB_SECRET", reveal_secret ? cfg_.job_secret : "<secret>"));
    return secret;
  }

  Y Env(const std::string& role) const {
    Y env = Y::List();
    std::map<std::string, std::string> vals;
    for (auto& [k, v] : cfg_.forward_env)
      if (Forwarded(k)) vals[k] = v;
    for (auto& [k, v] : cfg_.env) vals[k] = v;
    for (auto& [k, v] : (role == "worker" ? cfg_.env_worker : cfg_.env_server)) vals[k] = v;
    vals.erase("PSKV_JOB_SECRET");
    vals.erase("PSKV_JOB_SECRET_FILE");
    if (!mxjob_) {  // the training operator sets these for an MXJob
      vals["DMLC_ROLE"] = role;
      vals["DMLC_PS_ROOT_URI"] = svc_ + "." + ns_ + ".svc";
      vals["DMLC_PS_ROOT_PORT"] = std::to_string(port_);
      vals["DMLC_NUM_WORKER"] = std::to_string(cfg_.num_workers);
      vals["DMLC_NUM_SERVER"] = std::to_string(cfg_.num_servers);
    }
    vals["PSKV_JOB_ID"] = job_id_;
    vals["DMLC_JOB_CLUSTER"] = "kubernetes";
    for (auto& [k, v] : vals) env.Add(EnvVar(k, v));
    env.Add(FieldEnv("DMLC_NODE_HOST", "status.podIP"));
    if (!mxjob_ && role != "scheduler")
      env.Add(FieldEnv("DMLC_TASK_ID",
                       "metadata.annotations['batch.kubernetes.io/job-completion-index']"));
    if (!cfg_.job_secret.empty()) env.Add(SecretEnv(secret_name_));
    return env;
  }

  Y Container(const std::string& role, const std::string& cname) const {
    Y c;
    c("name", cname)("image", cfg_.k8s_image)(
        "command", Command(role == "worker" ? cfg_.command : server_argv_))("env", Env(role));
    if (role == "scheduler")
      c("ports", Y::List().Add(Y()("name", mxjob_ ? "mxjob-port" : "scheduler")(
                     "containerPort", Y::Num(port_))("protocol", "TCP")));
    if (!cfg_.k8s_cpu.empty() || !cfg_.k8s_memory.empty()) c("resources", Resources(cfg_));
    return c;
  }

  // --k8s-kind mxjob: one Kubeflow MXJob holding all three roles.
  Y MxJob() const {
    Y specs;
    for (auto [role, kind, count] :
         {std::tuple<std::string, std::string, int>{"scheduler", "Scheduler", 1},
          {"server", "Server", cfg_.num_servers},
          {"worker", "Worker", cfg_.num_workers}}) {
      specs(kind, Y()("replicas", Y::Num(count))("restartPolicy", "Never")(
                      "template",
                      Y()("metadata", Y()("labels", Labels(role)))(
                          "spec", Y()("containers", Y::List().Add(Container(role, "mxnet"))))));
    }
    Y job;
    job("apiVersion", "kubeflow.org/v1")("kind", "MXJob")("metadata", Meta(name_, ""))(
        "spec", Y()("jobMode", "MXTrain")(
                    "runPolicy", Y()("backoffLimit", Y::Num(0))("cleanPodPolicy", "Running"))(
                    "mxReplicaSpecs", specs));
    return job;
  }

  // The headless Service that gives the scheduler's pod its stable name.
  Y Service() const {
    Y service;
    service("apiVersion", "v1")("kind", "Service")("metadata", Meta(svc_, "scheduler"))(
        "spec", Y()("clusterIP", "None")("publishNotReadyAddresses", Y::Bool(true))(
                    "selector", Y()("pskv/job", name_)("pskv/role", "scheduler"))(
                    "ports", Y::List().Add(Y()("name", "scheduler")("port", Y::Num(port_))(
                                 "targetPort", Y::Num(port_))("protocol", "TCP"))));
    return service;
  }

  Y IndexedJob(const std::string& role, int count) const {
    Y job;
    const std::string obj = name_ + "-" + role;
    // backoffLimit 0: a failed pod fails the job (the others report it and exit).
    job("apiVersion", "batch/v1")("kind", "Job")("metadata", Meta(obj, role))(
        "spec",
        Y()("completionMode", "Indexed")("completions", Y::Num(count))(
            "parallelism", Y::Num(count))("backoffLimit", Y::Num(0))(
            "template", Y()("metadata", Y()("labels", Labels(role)))(
                            "spec", Y()("restartPolicy", "Never")("subdomain", svc_)(
                                        "containers", Y::List().Add(Container(role, role))))));
    return job;
  }

  const LaunchConfig& cfg_;
  const std::string job_id_;
  const std::string name_;
  const std::string ns_;
  const std::string secret_name_;
  const std::string svc_;
  const int port_;
  const bool mxjob_;
  const std::vector<std::string> server_argv_;
};

}  // namespace

std::string KubernetesManifests(const LaunchConfig& cfg, const std::string& job_id,
                                bool reveal_secret) {
  return Manifests(cfg, job_id).Text(reveal_secret);
}

int LaunchKubernetes(const LaunchConfig& cfg, const std::string& job_id) {
  if (!cfg.k8s_apply) {
    std::string text = KubernetesManifests(cfg, job_id, false);
    std::string name = cfg.k8s_job_name.empty() ? "pskv-" + job_id : cfg.k8s_job_name;
    std::printf("# pskv job %s: %d workers, %d servers (%s)\n", name.c_str(), cfg.num_workers,
                cfg.num_servers, cfg.k8s_kind == "mxjob" ? "Kubeflow MXJob" : "Indexed Jobs");
    if (!cfg.job_secret.empty())
      std::printf(
          "# The Secret below is masked. Submit with `pskv-launch ... --apply`, or create it "
          "yourself:\n"
          "#   kubectl -n %s create secret generic %s-secret --from-file=PSKV_JOB_SECRET=FILE\n"
          "# and apply the other objects.\n",
          cfg.k8s_namespace.c_str(), name.c_str());
    std::fputs(text.c_str(), stdout);
    return 0;
  }
  // kubectl reads the manifests (with the real secret) on its stdin: the value is on
  // no command line and in no file.
  ChildSpec spec;
  spec.name = "kubectl";
  spec.argv = {"kubectl", "apply", "-f", "-"};
  if (cfg.dry_run) spec.argv.push_back("--dry-run=client");
  spec.stdin_pipe = true;
  spec.stdin_data = KubernetesManifests(cfg, job_id, true);
  spec.close_stdin = true;
  SuperviseOptions so;
  so.timestamps = cfg.timestamps;
  so.summary = false;
  so.timeout = std::chrono::seconds(cfg.timeout_s ? cfg.timeout_s : 120);
  int rc = Supervise({spec}, so);
  if (rc == 0)
    Say("submitted; follow it with: kubectl -n " + cfg.k8s_namespace + " get pods -l pskv/job=" +
        (cfg.k8s_job_name.empty() ? "pskv-" + job_id : cfg.k8s_job_name));
  return rc;
}

}  // namespace pskv::launcher
