#!/usr/bin/python3
"""Where a cluster job's CPU went: a `perf record -a -g` file (bench/cluster/scaling.py
--profile writes one per row, of the timed steps only) split into the costs that issue
40 item 2 names. Every sample is one CPU's time (perf samples each CPU at the same
rate), so fractions of the samples are fractions of the machine's CPU time; the idle
loop's samples are left out (`busy_samples` counts the rest).

A sample is put in the first category whose rule matches (its leaf function, then its
call chain from the leaf up):

  kernel_copy_send / kernel_copy_recv   copies between user memory and socket buffers
                    (copy_user / rep_movs / _copy_{from,to}_iter under tcp_sendmsg / tcp_recvmsg;
                    elsewhere kernel_copy_other)
  checksums         csum_* (veth hands packets on with the checksum left undone: expected ~0)
  page_faults       page faults and page zeroing (clear_page, do_anonymous_page, ...)
  softirq_net       the receive side of a packet: softirqs, veth, bridge, ip, tcp_v4_rcv, ...
  qdisc_xmit        the send side below TCP: dev_queue_xmit, tbf (the rate limiter), veth_xmit
  tcp_send / tcp_recv   the rest of tcp_sendmsg / tcp_recvmsg (skb alloc, segmenting, acks)
  pacing_timers     hrtimers, tcp_pace_kick, the timer interrupt
  wakeups_sched     futex, epoll / poll, schedule and wake-ups, context switches
  syscall_other     other kernel work in a syscall (entry/exit, other calls)
  kernel_other      other kernel work
  user_memcpy       libc memcpy / memmove in the job's processes (the workers' Python does
                    no copy in the timed loop, so these are pskv's: pull answers into the
                    output, shared-memory rings, the first push of a round, staging; libc has
                    no frame pointers, `SCALING_PERF_CALLGRAPH=dwarf,16384` names the callers)
  pskv_sums         pskv's element-wise sums (SumRange, AddTo)
  pskv_other        the rest of pskv's own code (receive loop, parser, rounds, ...)
  libc_other        libc and vDSO outside memcpy: syscall stubs (epoll_wait, sched_yield),
                    clock_gettime, malloc / free
  python_numpy      the interpreter, numpy, other user libraries
  other_processes   ssh / sshd / bash / perf / kernel threads other than ksoftirqd

    bench/cluster/cpu_breakdown.py FILE.perf.data [--top N]
"""
import collections
import json
import re
import subprocess
import sys

IDLE = re.compile(r'^(pv_native_safe_halt|default_idle|native_safe_halt|cpuidle_|do_idle|cpu_startup_entry|'
                  r'intel_idle|acpi_idle|mwait_idle|poll_idle)')
COPY = re.compile(r'^(copy_user|rep_movs|_copy_from_iter|_copy_to_iter|__copy_|copyin|copyout|'
                  r'copy_page_|memcpy|__memcpy|memmove|skb_copy_datagram|simple_copy_to_iter)')
CSUM = re.compile(r'csum')
FAULT = re.compile(r'^(clear_page|exc_page_fault|do_anonymous_page|handle_mm_fault|__handle_mm_fault|'
                   r'do_user_addr_fault|do_fault|folio_zero|zap_|unmap_|__do_munmap|do_mmap|'
                   r'free_pages|release_pages|free_unref)')
SOFTIRQ = re.compile(r'^(net_rx_action|__do_softirq|handle_softirqs|do_softirq|__napi_poll|process_backlog|'
                     r'__netif_receive_skb|netif_receive_skb|veth_poll|br_handle_frame|ip_rcv|tcp_v4_rcv|'
                     r'ip_local_deliver)')
XMIT = re.compile(r'^(__dev_queue_xmit|dev_queue_xmit|__qdisc_run|sch_direct_xmit|tbf_|dev_hard_start_xmit|'
                  r'veth_xmit|br_dev_xmit|ip_finish_output)')
TIMER = re.compile(r'^(hrtimer|__hrtimer|tcp_pace_kick|sysvec_apic_timer|tick_|tcp_tsq|tcp_wfree|'
                   r'update_process_times|timerqueue)')
SCHED = re.compile(r'^(futex|__futex|do_futex|do_epoll|ep_poll|__x64_sys_epoll|do_sys_poll|__x64_sys_poll|'
                   r'do_poll|schedule|__schedule|try_to_wake_up|wake_up|__wake_up|finish_task_switch|'
                   r'pick_next|dequeue_task|enqueue_task|__switch_to|switch_mm|psi_|ttwu_|select_task_rq|'
                   r'do_nanosleep|hrtimer_nanosleep|sched_|update_curr|update_load)')
SYSCALL = re.compile(r'^(entry_SYSCALL|do_syscall_64|syscall_exit|__x64_sys_)')
OTHER_COMM = re.compile(r'^(ssh|sshd|bash|sh|perf|kworker|rcu_|migration|khugepaged|kcompactd|'
                        r'systemd|sleep|ip|tc|pskv-launch)')
CATEGORIES = ['kernel_copy_send', 'kernel_copy_recv', 'kernel_copy_other', 'checksums', 'page_faults',
              'softirq_net', 'qdisc_xmit', 'tcp_send', 'tcp_recv', 'pacing_timers', 'wakeups_sched',
              'syscall_other', 'kernel_other', 'user_memcpy', 'pskv_sums', 'pskv_other', 'libc_other',
              'python_numpy', 'other_processes']
# The categories' groups (the issue's terms).
GROUPS = {'kernel_tcp_veth_qdisc': ['kernel_copy_send', 'kernel_copy_recv', 'kernel_copy_other', 'checksums',
                                    'softirq_net', 'qdisc_xmit', 'tcp_send', 'tcp_recv', 'pacing_timers'],
          'wakeups_syscalls': ['wakeups_sched', 'syscall_other', 'libc_other'],
          'pskv_user': ['user_memcpy', 'pskv_sums', 'pskv_other'],
          'other': ['page_faults', 'kernel_other', 'python_numpy', 'other_processes']}


def samples(path):
    """(comm, [(sym, dso)] leaf first) per sample of `perf script`."""
    p = subprocess.Popen(['perf', 'script', '-i', path, '-F', 'comm,ip,sym,dso', '--no-inline'],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, errors='replace')
    comm, stack = None, []
    for line in p.stdout:
        if not line.strip():
            if comm is not None:
                yield comm, stack
            comm, stack = None, []
            continue
        if line[0] not in ' \t':
            if comm is not None:
                yield comm, stack
            comm, stack = line.strip(), []
            continue
        parts = line.strip().split(None, 1)
        rest = parts[1] if len(parts) > 1 else ''
        m = re.match(r'(.*?)\s+\((.*)\)$', rest)
        sym, dso = (m.group(1), m.group(2)) if m else (rest, '')
        sym = re.sub(r'\+0x[0-9a-f]+$', '', sym)
        stack.append((sym, dso))
    if comm is not None:
        yield comm, stack
    p.wait()


def kernel(dso):
    return 'kernel' in dso or (dso.startswith('[') and dso != '[vdso]')


def classify(comm, stack):
    if not stack:
        return 'kernel_other'
    syms = [s for s, _ in stack]
    leaf, leaf_dso = stack[0]
    if IDLE.match(leaf) or (comm == 'swapper' and not any(SOFTIRQ.match(s) or TIMER.match(s) for s in syms)):
        return None
    if OTHER_COMM.match(comm) and not comm.startswith('ksoftirqd'):
        return 'other_processes'
    if kernel(leaf_dso):
        if CSUM.search(leaf):
            return 'checksums'
        if COPY.match(leaf):
            for s in syms:
                if s.startswith('tcp_sendmsg') or s.startswith('tcp_sendpage'):
                    return 'kernel_copy_send'
                if s.startswith('tcp_recvmsg') or s.startswith('tcp_read'):
                    return 'kernel_copy_recv'
            return 'kernel_copy_other'
        for s in syms:
            if FAULT.match(s):
                return 'page_faults'
            if SOFTIRQ.match(s):
                return 'softirq_net'
            if XMIT.match(s):
                return 'qdisc_xmit'
            if TIMER.match(s):
                return 'pacing_timers'
            if s.startswith('tcp_sendmsg'):
                return 'tcp_send'
            if s.startswith('tcp_recvmsg'):
                return 'tcp_recv'
            if SCHED.match(s):
                return 'wakeups_sched'
        if any(SYSCALL.match(s) for s in syms):
            return 'syscall_other'
        return 'kernel_other'
    if re.match(r'^(__)?(memcpy|memmove|__memmove|__memcpy)', leaf):
        return 'user_memcpy'
    if 'pskv' in leaf_dso:
        return 'pskv_sums' if re.search(r'SumRange|AddTo|Reducer::Sum|Axpy', leaf) else 'pskv_other'
    if 'libc.so' in leaf_dso or leaf_dso == '[vdso]' or 'libstdc++' in leaf_dso:
        return 'libc_other'
    return 'python_numpy'


def breakdown(path, top=12):
    counts = collections.Counter()
    leaves = collections.defaultdict(collections.Counter)
    total = 0
    for comm, stack in samples(path):
        total += 1
        cat = classify(comm, stack)
        if cat is None:
            continue
        counts[cat] += 1
        if stack:
            leaves[cat][stack[0][0] + (' [%s]' % comm if cat == 'other_processes' else '')] += 1
    busy = sum(counts.values())
    return {'samples': total, 'busy_samples': busy,
            'fractions': {c: round(counts[c] / busy, 4) if busy else 0.0 for c in CATEGORIES},
            'groups': {g: round(sum(counts[c] for c in cs) / busy, 4) if busy else 0.0 for g, cs in GROUPS.items()},
            'top_leaves': {c: [[s, round(n / busy, 4)] for s, n in leaves[c].most_common(top)]
                           for c in CATEGORIES if counts[c]}}


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    top = int(sys.argv[sys.argv.index('--top') + 1]) if '--top' in sys.argv else 12
    b = breakdown(sys.argv[1], top)
    print(json.dumps(b, indent=1))


if __name__ == '__main__':
    main()
