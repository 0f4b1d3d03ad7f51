/* sim_main.c — the loom_sim program: predicts train_gpt's step at many rank counts from a
 * recorded profile and a cluster file, for each strategy; prints a table, writes CSV and a PNG. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loom_moe.h"
#include "loom_sim.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: loom_sim --profile FILE --cluster FILE [options]\n"
          "Predicts the training step of the profiled model at each rank count of a cluster,\n"
          "for every strategy asked for, from a profile recorded by a real run\n"
          "(train_gpt --profile FILE) and a cluster description.\n"
          "  --profile FILE   the profile (train_gpt --profile)\n"
          "  --cluster FILE   the cluster: lines 'name NAME', 'nodes N', 'ranks_per_node R',\n"
          "                   'cores_per_node C', 'intra ALPHA_US GBPS [shared]',\n"
          "                   'inter ALPHA_US GBPS [shared]', 'timeshare F' ('#' starts a\n"
          "                   comment); shared: the link's bandwidth is split among the node's\n"
          "                   ranks using it at once; timeshare: a core holding K > 1 ranks runs\n"
          "                   K (1 + F) times as long (tests/bench/timeshare_perf; default 0)\n"
          "  --ranks LIST     comma-separated rank counts (default 8,16,...,4096 up to the\n"
          "                   cluster's size)\n"
          "  --grad LIST      gradient strategies: none, plan, and codecs of the profile\n"
          "                   (fp16, int8...) (default: none,plan and every codec)\n"
          "  --moe LIST       MoE overlap modes none,coarse,fine (default all three when the\n"
          "                   profile has MoE layers)\n"
          "  --attn LIST      attention servers off,inplace (default off,inplace when the\n"
          "                   profile has documents)\n"
          "  --csv FILE       write every prediction as CSV\n"
          "  --png FILE       plot tokens/s and scaling efficiency against ranks (gnuplot)\n"
          "  --ep N           expert-parallel group size, LOOM_EP_SIZE (default 1, loom's\n"
          "                   default: every rank holds every expert); 0 = every rank, up to\n"
          "                   one expert each\n"
          "  --seed N         seed of the drawn documents (default 1)\n"
          "  --help           this text\n");
}

#define MAX_GRAD (2 + 64) // none, plan and every codec a profile holds (64 at most: sim_io.c)

typedef struct opts {
  const char *profile, *cluster, *csv, *png;
  int ranks[64], nranks;
  int grad[MAX_GRAD], ngrad; // loom_sim_grad_t or codec indices (after the profile is read)
  const char *grad_list;
  int moe[3], nmoe;
  int attn[2], nattn;
  unsigned long long seed;
  int ep; // --ep
} opts_t;

static int parse_list_int(const char *s, int *out, int cap, int *n) {
  char buf[1024];
  if (strlen(s) >= sizeof buf) { // (cut short, its last count would be another)
    fprintf(stderr,
            "loom_sim: --ranks: the list is longer than %d characters: give at most %d "
            "rank counts\n",
            (int)sizeof buf - 1, cap);
    return -1;
  }
  snprintf(buf, sizeof buf, "%s", s);
  *n = 0;
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *end;
    long v = strtol(tok, &end, 10);
    if (*end || v < 1 || v > (1L << 24)) {
      fprintf(stderr,
              "loom_sim: --ranks: '%s' is not a rank count: give a comma list of at most %d rank "
              "counts, each in 1..16777216\n",
              tok, cap);
      return -1;
    }
    if (*n >= cap) {
      fprintf(stderr, "loom_sim: --ranks: more than %d rank counts: give at most %d\n", cap, cap);
      return -1;
    }
    for (int j = 0; j < *n; j++) {
      if (out[j] == (int)v) { // (a second row of the same prediction)
        fprintf(stderr, "loom_sim: --ranks: %ld is repeated: give each rank count once\n", v);
        return -1;
      }
    }
    out[(*n)++] = (int)v;
  }
  if (*n == 0) {
    fprintf(stderr, "loom_sim: --ranks: give a comma list of rank counts, such as 1,2,4,8\n");
    return -1;
  }
  return 0;
}

// Names in list (comma-separated) mapped through names[] to their index; -1 on an unknown one.
static int parse_names(const char *flag, const char *s, const char *const *names, int count,
                       int *out, int *n) {
  char buf[256];
  if (strlen(s) >= sizeof buf) {
    fprintf(stderr, "loom_sim: %s: the list is longer than %d characters\n", flag,
            (int)sizeof buf - 1);
    return -1;
  }
  snprintf(buf, sizeof buf, "%s", s);
  *n = 0;
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int k = 0, seen = 0;
    while (k < count && strcmp(names[k], tok) != 0) {
      k++;
    }
    for (int j = 0; j < *n; j++) {
      seen |= out[j] == k;
    }
    if (k == count || seen) {
      fprintf(stderr, "loom_sim: %s: unknown or repeated '%s'\n", flag, tok);
      return -1;
    }
    out[(*n)++] = k;
  }
  if (*n == 0) {
    fprintf(stderr, "loom_sim: %s: give at least one of", flag);
    for (int k = 0; k < count; k++) {
      fprintf(stderr, "%s %s", k ? "," : "", names[k]);
    }
    fprintf(stderr, "\n");
    return -1;
  }
  return 0;
}

// A whole number in lo..hi, digits only; -1 after naming the flag and the range.
static int parse_whole(const char *flag, const char *v, unsigned long long lo,
                       unsigned long long hi, unsigned long long *out) {
  char *end = NULL;
  errno = 0;
  *out = v[0] >= '0' && v[0] <= '9' ? strtoull(v, &end, 10) : 0;
  if (!end || *end || errno || *out < lo || *out > hi) {
    fprintf(stderr, "loom_sim: %s '%s': expected a whole number in %llu..%llu\n", flag, v, lo, hi);
    return -1;
  }
  return 0;
}

static const char *const moe_names[3] = {"none", "coarse", "fine"};
static const char *const attn_names[2] = {"off", "inplace"};

static int parse(int argc, char **argv, opts_t *o) {
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (!strcmp(f, "--help")) {
      usage(stdout);
      exit(0);
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "loom_sim: %s needs a value (see --help)\n", f);
      return -1;
    }
    const char *v = argv[++i];
    int rc = 0;
    if (!strcmp(f, "--profile")) {
      o->profile = v;
    } else if (!strcmp(f, "--cluster")) {
      o->cluster = v;
    } else if (!strcmp(f, "--csv")) {
      o->csv = v;
    } else if (!strcmp(f, "--png")) {
      o->png = v;
    } else if (!strcmp(f, "--ranks")) {
      rc = parse_list_int(v, o->ranks, 64, &o->nranks);
    } else if (!strcmp(f, "--grad")) {
      o->grad_list = v;
    } else if (!strcmp(f, "--moe")) {
      rc = parse_names(f, v, moe_names, 3, o->moe, &o->nmoe);
    } else if (!strcmp(f, "--attn")) {
      rc = parse_names(f, v, attn_names, 2, o->attn, &o->nattn);
    } else if (!strcmp(f, "--ep")) {
      unsigned long long ep = 0;
      rc = parse_whole(f, v, 0, 1ULL << 24, &ep);
      o->ep = (int)ep;
    } else if (!strcmp(f, "--seed")) {
      rc = parse_whole(f, v, 0, ULLONG_MAX, &o->seed);
    } else {
      fprintf(stderr, "loom_sim: unknown flag '%s' (see --help)\n", f);
      return -1;
    }
    if (rc) { // the parser named the flag and the problem
      return -1;
    }
  }
  if (!o->profile || !o->cluster) {
    fprintf(stderr, "loom_sim: --profile and --cluster are required (see --help)\n");
    return -1;
  }
  return 0;
}

static int parse_grad(opts_t *o, const loom_sim_profile_t *p) {
  o->ngrad = 0;
  if (!o->grad_list) {
    o->grad[o->ngrad++] = LOOM_SIM_GRAD_NONE;
    o->grad[o->ngrad++] = LOOM_SIM_GRAD_PLAN;
    for (int k = 0; k < p->ncodecs && o->ngrad < MAX_GRAD; k++) {
      o->grad[o->ngrad++] = k;
    }
    return 0;
  }
  char buf[1024];
  if (strlen(o->grad_list) >= sizeof buf) { // (cut short, its last name would be another)
    fprintf(stderr, "loom_sim: --grad: the list is longer than %d characters: name fewer\n",
            (int)sizeof buf - 1);
    return -1;
  }
  snprintf(buf, sizeof buf, "%s", o->grad_list);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int g = !strcmp(tok, "none")   ? LOOM_SIM_GRAD_NONE
            : !strcmp(tok, "plan") ? LOOM_SIM_GRAD_PLAN
                                   : -3;
    for (int k = 0; g == -3 && k < p->ncodecs; k++) {
      g = !strcmp(p->codecs[k].compressor, tok) ? k : -3;
    }
    if (o->ngrad >= MAX_GRAD) {
      fprintf(stderr, "loom_sim: --grad: more than %d strategies: name each one once\n", MAX_GRAD);
      return -1;
    }
    if (g == -3) {
      fprintf(stderr, "loom_sim: --grad: '%s' is neither none, plan nor a codec of the profile (",
              tok);
      for (int k = 0; k < p->ncodecs; k++) {
        fprintf(stderr, "%s%s", k ? ", " : "", p->codecs[k].compressor);
      }
      fprintf(stderr, ")\n");
      return -1;
    }
    for (int j = 0; j < o->ngrad; j++) {
      if (o->grad[j] == g) { // (the same rows twice, and two curves of one label)
        fprintf(stderr, "loom_sim: --grad: '%s' is repeated: name each strategy once\n", tok);
        return -1;
      }
    }
    o->grad[o->ngrad++] = g;
  }
  return 0;
}

// s inside a gnuplot single-quoted string: a quote doubled. The labels hold the profile's codec
// specs (untrusted): an undoubled quote ended the string and the rest ran as gnuplot commands.
static void put_quoted(FILE *g, const char *s) {
  for (; *s; s++) {
    if (*s == '\'') {
      fputc('\'', g);
    }
    fputc(*s, g);
  }
}

// s as one CSV field: quoted (a quote doubled) when it holds a comma, a quote or a newline. The
// cluster's name and the profile's codec specs reach the CSV; a comma in one shifted the columns
// after it (the plot then read the strategy id from another column).
static void put_csv(FILE *f, const char *s) {
  if (!strpbrk(s, ",\"\n\r")) {
    fputs(s, f);
    return;
  }
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"') {
      fputc('"', f);
    }
    fputc(*s, f);
  }
  fputc('"', f);
}

// gnuplot: tokens/s and efficiency against ranks, one line per strategy, from the CSV.
static int plot(const char *png, const char *csv, char labels[][96], int nstrat) {
  FILE *g = popen("gnuplot", "w");
  if (!g) {
    fprintf(stderr, "loom_sim: cannot run gnuplot (install the Debian package gnuplot-nox)\n");
    return -1;
  }
  fprintf(g,
          "set terminal pngcairo size 1300,520\nset output '%s'\nset datafile separator ','\n"
          "set multiplot layout 1,2\nset logscale x 2\nset key left top font ',8'\n"
          "set xlabel 'ranks'\nset grid\n",
          png);
  for (int pass = 0; pass < 2; pass++) {
    fprintf(g, pass ? "unset logscale y\nset yrange [0:1.1]\nset ylabel 'scaling efficiency'\n"
                      "set title 'predicted efficiency (tokens/s per rank vs 1 rank)'\nplot "
                    : "set logscale y\nset ylabel 'tokens/s'\nset title 'predicted throughput'\n"
                      "plot ");
    for (int k = 0; k < nstrat; k++) {
      fprintf(g, "%s'%s' every ::1 using ($14==%d ? $1 : 1/0):%d with linespoints title '",
              k ? ", " : "", csv, k, pass ? 11 : 10);
      put_quoted(g, labels[k]);
      fputc('\'', g);
    }
    fprintf(g, "\n");
  }
  fprintf(g, "unset multiplot\n");
  int rc = pclose(g);
  if (rc != 0) { // the shell's 127: no gnuplot; anything else: gnuplot said why above
    fprintf(stderr, "loom_sim: gnuplot failed (status %d%s): no %s\n", rc,
            WIFEXITED(rc) && WEXITSTATUS(rc) == 127 ? ": install the Debian package gnuplot-nox"
                                                    : "",
            png);
    return -1;
  }
  return 0;
}

// The library logs an error as a WARN line prefixed for an MPI job (host:pid:tid [rank] LOOM WARN
// ALL file:line), which on a command line reads as noise: the loads run with stderr closed off
// (unless LOOM_DEBUG asks for log lines) and a failure is said once as "loom_sim: MESSAGE".
static loom_status_t load_quietly(const char *path, int cluster, loom_sim_profile_t *p,
                                  loom_sim_cluster_t *c) {
  int saved = -1;
  if (!getenv("LOOM_DEBUG")) {
    fflush(stderr);
    int devnull = open("/dev/null", O_WRONLY);
    saved = devnull >= 0 ? dup(STDERR_FILENO) : -1;
    if (saved >= 0) {
      dup2(devnull, STDERR_FILENO);
    }
    if (devnull >= 0) {
      close(devnull);
    }
  }
  loom_status_t st = cluster ? loom_sim_cluster_load(path, c) : loom_sim_profile_load(path, p);
  if (saved >= 0) {
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
  }
  if (st != LOOM_OK) {
    fprintf(stderr, "loom_sim: %s\n", loom_last_error(NULL));
  }
  return st;
}

int main(int argc, char **argv) {
  opts_t o = {.seed = 1, .ep = 1};
  if (parse(argc, argv, &o) != 0) {
    return 2;
  }
  loom_sim_profile_t p;
  loom_sim_cluster_t c;
  if (load_quietly(o.profile, 0, &p, NULL) != LOOM_OK) {
    return 1;
  }
  if (load_quietly(o.cluster, 1, NULL, &c) != LOOM_OK) {
    loom_sim_profile_free(&p);
    return 1;
  }
  int rc = parse_grad(&o, &p) == 0 ? 0 : 2;
  if (rc == 0 && o.nmoe > 0 && p.moe_layers == 0) { // (each mode printed the same rows, unnamed)
    fprintf(stderr,
            "loom_sim: --moe: the profile %s has no MoE layers (train_gpt ran without "
            "--moe-experts): leave --moe out\n",
            o.profile);
    rc = 2;
  }
  const long long size = (long long)c.nodes * c.ranks_per_node;
  for (int k = 0; rc == 0 && k < o.nranks; k++) { // before anything is printed
    if (o.ranks[k] > size) {
      fprintf(stderr,
              "loom_sim: --ranks: %d is more than the %lld ranks of cluster %s (%s: %d nodes x %d "
              "ranks_per_node): give counts in 1..%lld, or raise nodes or ranks_per_node in the "
              "cluster file\n",
              o.ranks[k], size, c.name, o.cluster, c.nodes, c.ranks_per_node, size);
      rc = 2;
    }
  }
  if (!o.nranks) {
    for (long long r = 8; r <= 4096 && r <= size; r *= 2) {
      o.ranks[o.nranks++] = (int)r;
    }
    if (!o.nranks) {
      o.ranks[o.nranks++] = (int)size;
    }
  }
  if (!o.nmoe) {
    o.moe[o.nmoe++] = p.moe_layers > 0 ? LOOM_MOE_OVERLAP_NONE : LOOM_MOE_OVERLAP_FINE;
    if (p.moe_layers > 0) {
      o.moe[o.nmoe++] = LOOM_MOE_OVERLAP_COARSE;
      o.moe[o.nmoe++] = LOOM_MOE_OVERLAP_FINE;
    }
  }
  if (!o.nattn) {
    o.attn[o.nattn++] = 0;
    if (p.ndocs > 0 && p.attn_ms > 0) {
      o.attn[o.nattn++] = 1;
    }
  }
  if (rc == 0 && o.png) { // checked before the run: gnuplot quotes the paths, and writes the
    // picture to stdout when it cannot open the output
    FILE *f = NULL;
    if (!o.csv) {
      fprintf(stderr, "loom_sim: --png plots the CSV: pass --csv FILE too\n");
      rc = 2;
    } else if (strpbrk(o.png, "'\n") || strpbrk(o.csv, "'\n")) {
      fprintf(stderr, "loom_sim: --png and --csv paths cannot hold a quote or a newline (gnuplot "
                      "reads them quoted): rename the path\n");
      rc = 2;
    } else if (!(f = fopen(o.png, "a"))) {
      fprintf(stderr, "loom_sim: cannot write %s: %s\n", o.png, strerror(errno));
      rc = 1;
    }
    if (f) {
      fclose(f);
    }
  }
  FILE *csv = NULL;
  if (rc == 0 && o.csv && !(csv = fopen(o.csv, "w"))) {
    fprintf(stderr, "loom_sim: cannot write %s: %s\n", o.csv, strerror(errno));
    rc = 1;
  }
  if (csv) {
    fprintf(csv, "ranks,nodes,step_ms,compute_ms,grad_exposed_ms,grad_bytes,moe_a2a_ms,"
                 "moe_exposed_ms,attn_ship_ms,tokens_per_s,efficiency,attn_imbalance,cluster,"
                 "strategy_id,strategy,moe_imbalance\n");
  }
  if (rc == 0) {
    printf("loom_sim: profile %s (np %d, %lld tokens per rank, compute %.2f ms of which "
           "attention %.2f (exchanges %.2f), measured step %.2f ms, %d gradients, %d codecs%s), "
           "cluster %s: %d nodes x %d ranks, %d cores per node (timeshare %.3f), intra %.1f us "
           "%.1f Gbit/s%s, inter %.1f us %.1f Gbit/s%s\n",
           o.profile, p.np, (long long)p.tokens, p.compute_ms, p.attn_ms, p.attn_exchange_ms,
           p.step_ms, p.ntensors, p.ncodecs, p.moe_layers ? ", MoE" : "", c.name, c.nodes,
           c.ranks_per_node, c.cores_per_node, c.timeshare, c.intra.alpha_us, c.intra.gbps,
           c.intra_shared ? " shared" : "", c.inter.alpha_us, c.inter.gbps,
           c.inter_shared ? " shared" : "");
    printf("%-30s %6s %5s %10s %10s %9s %9s %9s %6s %12s %6s\n", "strategy", "ranks", "nodes",
           "step_ms", "compute", "grad_exp", "moe_exp", "attn_ship", "imbal", "tokens/s", "eff");
  }
  int sid = 0;
  static char labels[MAX_GRAD * 3 * 2][96];
  for (int gi = 0; rc == 0 && gi < o.ngrad; gi++) {
    for (int mi = 0; rc == 0 && mi < o.nmoe; mi++) {
      for (int ai = 0; rc == 0 && ai < o.nattn; ai++, sid++) {
        loom_sim_strategy_t s = {.grad = o.grad[gi],
                                 .moe_overlap = o.moe[mi],
                                 .attn_servers = o.attn[ai],
                                 .ep_size = o.ep};
        loom_sim_result_t one;
        if (loom_sim_predict(&p, &c, 1, &s, o.seed, &one) != LOOM_OK) {
          rc = 1;
          break;
        }
        char *label = labels[sid];
        snprintf(label, sizeof labels[sid], "grad=%s%s%s attn=%s", one.grad_strategy,
                 p.moe_layers ? " moe=" : "", p.moe_layers ? moe_names[s.moe_overlap] : "",
                 attn_names[s.attn_servers]);
        for (int k = 0; k < o.nranks; k++) {
          loom_sim_result_t r;
          if (loom_sim_predict(&p, &c, o.ranks[k], &s, o.seed, &r) != LOOM_OK) {
            rc = 1;
            break;
          }
          double eff = one.tokens_per_s > 0 ? r.tokens_per_s / (o.ranks[k] * one.tokens_per_s) : 0;
          printf("%-30s %6d %5d %10.2f %10.2f %9.2f %9.2f %9.2f %6.2f %12.0f %6.3f\n", label,
                 r.ranks, r.nodes, r.step_ms, r.compute_ms, r.grad_exposed_ms, r.moe_exposed_ms,
                 r.attn_ship_ms, r.attn_imbalance, r.tokens_per_s, eff);
          if (csv) {
            fprintf(csv, "%d,%d,%.4f,%.4f,%.4f,%.0f,%.4f,%.4f,%.4f,%.1f,%.4f,%.4f,", r.ranks,
                    r.nodes, r.step_ms, r.compute_ms, r.grad_exposed_ms, r.grad_bytes, r.moe_a2a_ms,
                    r.moe_exposed_ms, r.attn_ship_ms, r.tokens_per_s, eff, r.attn_imbalance);
            put_csv(csv, c.name);
            fprintf(csv, ",%d,", sid);
            put_csv(csv, label);
            fprintf(csv, ",%.4f\n", r.moe_imbalance);
          }
        }
      }
    }
  }
  if (csv && fclose(csv) != 0) {
    fprintf(stderr, "loom_sim: writing %s failed\n", o.csv);
    rc = 1;
  }
  if (rc == 0 && o.png) {
    if (!o.csv) { // (refused before the run)
      fprintf(stderr, "loom_sim: --png plots the CSV: pass --csv FILE too\n");
      rc = 2;
    } else if (plot(o.png, o.csv, labels, sid) != 0) {
      rc = 1;
    } else {
      printf("loom_sim: wrote %s and %s\n", o.csv, o.png);
    }
  }
  loom_sim_profile_free(&p);
  return rc;
}
