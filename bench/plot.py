#!/usr/bin/python3
"""Plots of pskv's benchmark records (the JSON lines of `pskv-bench ... --json` and
`bench/train/run.py --json`) as PNG files, with Debian's python3-matplotlib:

  train.png     samples/s and test accuracy of every run of bench/train, DDP as the ceiling
  pushpull.png  push+pull GB/s per message size against the raw-transport ceiling
  reduce.png    reduction GB/s per array size against the memory-bandwidth ceiling
  sparse.png    samples/s and bytes per step: row_sparse vs dense pushes vs DDP (bench/sparse_bench.py)
  cluster_scaling.png  push+pull step time across namespace hosts / the parameter-server
                bound t_opt, per link rate, k and M: pskv, pskv with an even split, DDP-gloo
                (bench/cluster/scaling.py)
  cluster_servers.png  step time against the number of server hosts (the O(m/n) claim)
  cluster_paced.png    as cluster_scaling.png, with the connections paced by the kernel
                       (scaling.py --paced-repeat: PSKV_LINK_RATE = the measured B)
  cluster_default.png  as cluster_paced.png, pskv by default (the rate learned) against the
                       rate stated, unpaced and DDP (scaling.py --bench cluster_default)
  cluster_rate_change.png  step time over the bound, step by step, while a link's rate
                       changes or a competing flow runs (scaling.py --change / --compete
                       --bench cluster_default_change)

    bench/plot.py --out docs/img build/bench/*.json

Only the plots whose records are present are written. Prints the files written.
"""
import argparse
import json
import os
import sys


def load(paths):
    recs = []
    for p in paths:
        with open(p) as f:
            for line in f:
                line = line.strip()
                if line.startswith('{'):
                    recs.append(json.loads(line))
    return recs


def human_bytes(n):
    for unit in ('B', 'KiB', 'MiB', 'GiB'):
        if n < 1024:
            return '%d %s' % (n, unit)
        n //= 1024
    return '%d TiB' % n


def plot_train(recs, out, plt):
    short = {'pskv 1 process (local)': 'pskv local\n1 process', 'pskv 2 workers dist_sync': 'pskv sync\n2 workers',
             'pskv 2 workers dist_async': 'pskv async\n2 workers', 'torch DDP gloo 2 workers': 'DDP gloo\n2 workers'}
    names = [short.get(r['run'], r['run']) for r in recs]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    bars = a.bar(names, [r['samples_per_sec'] for r in recs], color=['#4477aa'] * (len(recs) - 1) + ['#999999'])
    a.axhline(recs[0]['ceiling_samples_per_sec'], color='#cc3311', ls='--', label='DDP (gloo)')
    a.set_ylabel('samples/s (all workers)')
    a.set_title('training throughput')
    a.bar_label(bars, fmt='%.0f')
    a.legend()
    bars = b.bar(names, [r['test_accuracy'] for r in recs], color='#228833')
    b.set_ylim(0, 1)
    b.set_ylabel('test accuracy')
    b.set_title('accuracy after the same steps')
    b.bar_label(bars, fmt='%.3f')
    for ax in (a, b):
        ax.tick_params(axis='x', labelsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def plot_sizes(recs, key, out, plt, title, xlabel):
    recs = sorted(recs, key=lambda r: r[key])
    xs = [r[key] for r in recs]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(xs, [r['gbps'] for r in recs], 'o-', label='pskv', color='#4477aa')
    ax.plot(xs, [r['ceiling_gbps'] for r in recs], 's--', label='ceiling', color='#cc3311')
    ax.set_xscale('log', base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([human_bytes(x) if key == 'bytes' else '%dKi' % (x // 1024) for x in xs], fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel('GB/s')
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def plot_sparse(recs, out, plt):
    names = [r['mode'].replace(' (gloo)', '\n(gloo)').replace('pskv ', 'pskv\n') for r in recs]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    bars = a.bar(names, [r['samples_per_s'] for r in recs], color='#4477aa')
    a.set_ylabel('samples/s (all workers)')
    a.set_title('%d x 64 embedding + MLP, %d workers' % (recs[0]['rows'], recs[0]['workers']))
    a.bar_label(bars, fmt='%.0f')
    bars = b.bar(names, [r['bytes_per_step_per_worker'] / 1e6 for r in recs], color='#cc6677')
    b.set_yscale('log')
    b.set_ylabel('MB on the wire per step and worker')
    b.set_title('communication (DDP: computed)')
    b.bar_label(bars, fmt='%.2f')
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def plot_cluster(recs, out, plt):
    rates = list(dict.fromkeys(r['rate'] for r in recs))  # in the order measured
    fig, axes = plt.subplots(1, len(rates), figsize=(6 * len(rates), 4.2), squeeze=False)
    for ax, rate in zip(axes[0], rates):
        rows = sorted([r for r in recs if r['rate'] == rate], key=lambda r: (r['extra_servers'], r['model_bytes']))
        x = list(range(len(rows)))
        labels = ['k=%d\n%s' % (r['extra_servers'], human_bytes(r['model_bytes'])) for r in rows]

        def bars(key, lo, hi, off, color, label, width):
            xs = [i + off for i, r in zip(x, rows) if key in r]
            ys = [r[key] / r['t_opt_s'] for r in rows if key in r]
            if not xs:
                return
            err = None
            if lo:
                err = [[(r[key] - r.get(lo, r[key])) / r['t_opt_s'] for r in rows if key in r],
                       [(r.get(hi, r[key]) - r[key]) / r['t_opt_s'] for r in rows if key in r]]
            ax.bar(xs, ys, width, yerr=err, capsize=2, color=color, label=label)

        # Only the columns measured get a bar, side by side.
        cols = [c for c in [
            ('pskv_s', 'pskv_min_s', 'pskv_max_s', '#4477aa', 'pskv, %s' % rows[0].get('pskv_pacing', 'default')),
            ('pskv_paced_s', 'pskv_paced_min_s', 'pskv_paced_max_s', '#228833', 'pskv, rate stated (PSKV_LINK_RATE = B)'),
            ('pskv_unpaced_s', 'pskv_unpaced_min_s', 'pskv_unpaced_max_s', '#ccbb44', 'pskv, unpaced (PSKV_LINK_RATE=0)'),
            ('pskv_even_s', 'pskv_even_min_s', 'pskv_even_max_s', '#88ccee', 'pskv, even split'),
            ('ddp_gloo_s', 'ddp_min_s', 'ddp_max_s', '#999999', 'DDP gloo (4 worker hosts)')]
            if any(c[0] in r for r in rows)]
        width = 0.8 / max(1, len(cols))
        for i, (key, lo, hi, color, label) in enumerate(cols):
            bars(key, lo, hi, (i - (len(cols) - 1) / 2) * width, color, label, width)
        ax.axhline(1.0, color='#cc3311', ls='--', label='t_opt = 2n(n-1)M / ((n²+kn-2k)B)')
        ax.axhline(1.1, color='#cc3311', ls=':', lw=0.8, label='t_opt + 10 %')
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_ylabel('step time / t_opt')
        ax.set_title('push+pull, n=%d workers, %s links (B = %.0f MB/s)' % (
            rows[0]['workers'], rate, rows[0]['link_bytes_per_s'] / 1e6), fontsize=10)
        ax.legend(fontsize=7, loc='upper left')
        ax.set_ylim(0, max(2.0, ax.get_ylim()[1]))
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def plot_rate_change(recs, out, plt):
    """Step time over the bound of the links then, step by step, per pacing mode: one
    panel per experiment (a link's rate changed mid-job, a competing flow)."""
    exps = list(dict.fromkeys((r['changes'], r.get('compete', '')) for r in recs))
    fig, axes = plt.subplots(1, len(exps), figsize=(6 * len(exps), 3.8), squeeze=False)
    for ax, (changes, compete) in zip(axes[0], exps):
        rows = [r for r in recs if (r['changes'], r.get('compete', '')) == (changes, compete)]
        for r in rows:
            ax.plot(range(1, len(r['step_vs_bound']) + 1), r['step_vs_bound'], marker='o', ms=3,
                    label=r['pacing'])
        ax.axhline(1.1, color='#cc3311', ls=':', lw=0.8, label='bound + 10 %')
        what = []
        if changes:
            what.append('link changes ' + changes + ' (after step:host:rate)')
        if compete:
            what.append('competing flow ' + compete + ' (from:to step, src:dst host)')
        r0 = rows[0]
        ax.set_title('k=%d, %s, %s links: %s' % (r0['extra_servers'], human_bytes(r0['model_bytes']), r0['rate'],
                                                  '; '.join(what)), fontsize=8)
        ax.set_xlabel('step')
        ax.set_ylabel('step time / bound of the links then')
        ax.set_ylim(0, max(2.0, ax.get_ylim()[1]))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def plot_servers(recs, out, plt):
    recs = sorted(recs, key=lambda r: r['servers'])
    s = [r['servers'] for r in recs]
    n, m, b = recs[0]['workers'], recs[0]['model_bytes'], recs[0]['link_bytes_per_s']
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.errorbar(s, [r['pskv_s'] for r in recs], yerr=[[r['pskv_s'] - r['pskv_min_s'] for r in recs],
                                                     [r['pskv_max_s'] - r['pskv_s'] for r in recs]],
                fmt='o-', color='#4477aa', capsize=3, label='pskv, measured')
    ax.plot(s, [r['t_bound_s'] for r in recs], 's--', color='#cc3311', label='bound max(1, n/S) M/B')
    fine = [x / 10 for x in range(int(min(s) * 10), int(max(s) * 10) + 1)]
    ax.plot(fine, [n * m / (x * b) for x in fine], ':', color='#999999', label='n M / (S B): O(m/n)')
    ax.set_xticks(s)
    ax.set_xlabel('server hosts S (servers on hosts of their own)')
    ax.set_ylabel('push+pull step time (s)')
    ax.set_title('%d workers, %s per step, %s links' % (n, human_bytes(m), recs[0]['rate']), fontsize=10)
    ax.set_ylim(0, None)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--out', default='.', help='directory for the PNG files')
    ap.add_argument('files', nargs='+', help='files of JSON lines')
    a = ap.parse_args(argv)
    try:
        import matplotlib
    except ImportError:
        sys.exit('bench/plot.py needs matplotlib: `apt-get install python3-matplotlib` (Debian), run with '
                 '/usr/bin/python3; the JSON results do not need it')
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    recs = load(a.files)
    os.makedirs(a.out, exist_ok=True)
    written = []
    # bench name -> (file, how it is drawn)
    plots = [
        ('train', 'train.png', plot_train),
        ('pushpull', 'pushpull.png', lambda r, out, plt: plot_sizes(
            r, 'bytes', out, plt, 'push+pull throughput (1 worker, 1 server)', 'message size')),
        ('reduce', 'reduce.png', lambda r, out, plt: plot_sizes(
            r, 'elements', out, plt, 'reduction of float32 arrays', 'elements')),
        ('sparse', 'sparse.png', plot_sparse),
        ('cluster_scaling', 'cluster_scaling.png', plot_cluster),
        ('cluster_paced', 'cluster_paced.png', plot_cluster),
        ('cluster_default', 'cluster_default.png', plot_cluster),
        ('cluster_default_change', 'cluster_rate_change.png', plot_rate_change),
        ('cluster_servers', 'cluster_servers.png', plot_servers),
    ]
    for bench, name, draw in plots:
        rows = [r for r in recs if r.get('bench') == bench]
        if rows:
            written.append(os.path.join(a.out, name))
            draw(rows, written[-1], plt)
    if not written:
        sys.exit('bench/plot.py: no benchmark records in %s' % ' '.join(a.files))
    for w in written:
        print(w)


if __name__ == '__main__':
    main()
