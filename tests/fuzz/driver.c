/*
 * driver.c — a main() for the fuzz targets where libFuzzer is not available.
 *
 *   fuzz_<name> [-n ITERATIONS] [-seed S] [-only I] PATH...
 *
 * Feeds LLVMFuzzerTestOneInput every file under each PATH (a folder or a
 * file; a missing folder counts as empty), then ITERATIONS inputs made by
 * deterministic random mutations of those seeds (bit flips, byte edits,
 * inserts, deletes, chunk copies, splices, truncation). Each input sits in a
 * buffer of exactly its size, so a sanitizer sees any read past its end.
 * When an input crashes the target, it is written to crash-<iteration> in the
 * working folder (from the sanitizer's death callback or a signal handler),
 * and `-only ITERATION` replays that one input.
 */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));
void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

#define FUZZ_MAX_INPUT (64 * 1024)
#define FUZZ_MAX_FILE (1024 * 1024)

struct seed {
    uint8_t *data;
    size_t size;
};

static struct seed *seeds;
static size_t n_seeds, cap_seeds;

/* The input being run, for the crash handlers. */
static const uint8_t *volatile cur_data;
static volatile size_t cur_size;
static volatile long cur_iter = -1;

static void save_crash(void)
{
    char name[64];
    int len = snprintf(name, sizeof name, "crash-%ld", (long)cur_iter);
    if (len <= 0 || !cur_data)
        return;
    int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        ssize_t w = write(fd, (const void *)cur_data, cur_size);
        (void)w;
        close(fd);
    }
    static const char msg[] = "fuzz driver: crashing input saved as ";
    ssize_t w = write(2, msg, sizeof msg - 1);
    w = write(2, name, (size_t)len);
    w = write(2, "\n", 1);
    (void)w;
}

static void on_signal(int sig)
{
    save_crash();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void add_seed(const uint8_t *data, size_t size)
{
    if (n_seeds == cap_seeds) {
        cap_seeds = cap_seeds ? 2 * cap_seeds : 16;
        seeds = realloc(seeds, cap_seeds * sizeof *seeds);
        if (!seeds)
            abort();
    }
    seeds[n_seeds].data = malloc(size ? size : 1);
    if (!seeds[n_seeds].data)
        abort();
    memcpy(seeds[n_seeds].data, data, size);
    seeds[n_seeds++].size = size;
}

static void add_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz driver: cannot open %s\n", path);
        exit(2);
    }
    uint8_t *buf = malloc(FUZZ_MAX_FILE);
    if (!buf)
        abort();
    size_t n = fread(buf, 1, FUZZ_MAX_FILE, f);
    fclose(f);
    add_seed(buf, n);
    free(buf);
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every regular file in dir, in name order so runs are reproducible. */
static void add_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "fuzz driver: no corpus at %s\n", dir);
        return;
    }
    char **names = NULL;
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        names = realloc(names, (n + 1) * sizeof *names);
        if (!names || !(names[n] = malloc(strlen(dir) + strlen(e->d_name) + 2)))
            abort();
        sprintf(names[n++], "%s/%s", dir, e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_names);
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode))
            add_file(names[i]);
        free(names[i]);
    }
    free(names);
}

/* xorshift64*: small, fast and the same everywhere. */
static uint64_t rng_state;

static uint64_t rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}

static size_t below(size_t n)
{
    return n ? (size_t)(rnd() % n) : 0;
}

/* Bytes that matter to the parsers we fuzz: syntax, escapes, boundaries. */
static const uint8_t interesting[] = {0,    0xff, 0x7f, 0x80, 0xc3, 0xe2, 0xf0, '"', '\'', '\\',
                                      '[',  ']',  '{',  '}',  '=',  ',',  '.',  '#', '\n', '\r',
                                      '\t', ' ',  '0',  '9',  '-',  '+',  'e',  'u', ':',  '_'};

static size_t mutate(uint8_t *buf, size_t size, size_t cap)
{
    int rounds = 1 + (int)below(8);
    for (int r = 0; r < rounds; r++) {
        switch (below(8)) {
        case 0: /* flip a bit */
            if (size)
                buf[below(size)] ^= (uint8_t)(1u << below(8));
            break;
        case 1: /* random byte */
            if (size)
                buf[below(size)] = (uint8_t)rnd();
            break;
        case 2: /* interesting byte */
            if (size)
                buf[below(size)] = interesting[below(sizeof interesting)];
            break;
        case 3: { /* insert an interesting or random byte */
            if (size >= cap)
                break;
            size_t at = below(size + 1);
            memmove(buf + at + 1, buf + at, size - at);
            buf[at] = below(2) ? interesting[below(sizeof interesting)] : (uint8_t)rnd();
            size++;
            break;
        }
        case 4: { /* delete a run */
            if (!size)
                break;
            size_t at = below(size), n = 1 + below(size - at < 16 ? size - at : 16);
            memmove(buf + at, buf + at + n, size - at - n);
            size -= n;
            break;
        }
        case 5: { /* copy a chunk of the input somewhere else in it */
            if (!size || size >= cap)
                break;
            size_t from = below(size), n = 1 + below(size - from), at = below(size + 1);
            if (n > cap - size)
                n = cap - size;
            memmove(buf + at + n, buf + at, size - at);
            memmove(buf + at, buf + (from >= at ? from + n : from), n);
            size += n;
            break;
        }
        case 6: { /* splice: replace the tail with another seed's tail */
            const struct seed *s = &seeds[below(n_seeds)];
            size_t at = below(size + 1), from = below(s->size + 1), n = s->size - from;
            if (n > cap - at)
                n = cap - at;
            memcpy(buf + at, s->data + from, n);
            size = at + n;
            break;
        }
        case 7: /* truncate */
            size = below(size + 1);
            break;
        }
    }
    return size;
}

static void run_one(const uint8_t *data, size_t size, long iter)
{
    /* An exactly-sized copy, so reading one byte past the end is caught. */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        abort();
    memcpy(copy, data, size);
    cur_data = copy;
    cur_size = size;
    cur_iter = iter;
    LLVMFuzzerTestOneInput(copy, size);
    cur_data = NULL;
    free(copy);
}

int main(int argc, char **argv)
{
    long iterations = 20000, only = -1;
    uint64_t seed = 0x9E3779B97F4A7C15ULL;
    if (LLVMFuzzerInitialize)
        LLVMFuzzerInitialize(&argc, &argv);
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i += 2) {
        if (i + 1 >= argc) {
            fprintf(stderr, "usage: %s [-n ITERATIONS] [-seed S] [-only I] PATH...\n", argv[0]);
            return 2;
        }
        if (strcmp(argv[i], "-n") == 0)
            iterations = strtol(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "-seed") == 0)
            seed = strtoull(argv[i + 1], NULL, 10) | 1;
        else if (strcmp(argv[i], "-only") == 0)
            only = strtol(argv[i + 1], NULL, 10);
        else {
            fprintf(stderr, "%s: unknown option %s\n", argv[0], argv[i]);
            return 2;
        }
    }
    for (; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) == 0 && S_ISREG(st.st_mode))
            add_file(argv[i]);
        else
            add_dir(argv[i]);
    }
    if (n_seeds == 0)
        add_seed((const uint8_t *)"", 0);

    if (__sanitizer_set_death_callback)
        __sanitizer_set_death_callback(save_crash);
    signal(SIGSEGV, on_signal);
    signal(SIGBUS, on_signal);
    signal(SIGFPE, on_signal);
    signal(SIGILL, on_signal);
    signal(SIGABRT, on_signal);

    /* Seeds first, as iterations -n_seeds .. -1. */
    long first = -(long)n_seeds;
    for (size_t s = 0; s < n_seeds; s++)
        if (only < 0 || only == first + (long)s)
            run_one(seeds[s].data, seeds[s].size, first + (long)s);

    uint8_t *buf = malloc(FUZZ_MAX_INPUT);
    if (!buf)
        abort();
    rng_state = seed;
    for (long it = 0; it < iterations; it++) {
        const struct seed *s = &seeds[below(n_seeds)];
        size_t size = s->size < FUZZ_MAX_INPUT ? s->size : FUZZ_MAX_INPUT;
        memcpy(buf, s->data, size);
        size = mutate(buf, size, FUZZ_MAX_INPUT);
        if (only < 0 || only == it)
            run_one(buf, size, it);
    }
    free(buf);
    printf("%s: %zu seeds and %ld mutations, no crash\n", argv[0], n_seeds, iterations);
    for (size_t s = 0; s < n_seeds; s++)
        free(seeds[s].data);
    free(seeds);
    return 0;
}
