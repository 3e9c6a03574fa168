/* The foliofs C ABI end to end: format an image with 16 KiB blocks, open it
 * with options, write a file, sync, read it back, stat it, truncate it,
 * list a directory, and see errors come back as negative errnos.
 * Built and run by tests/c_example.rs:
 *   cc example.c -Iinclude -Ltarget/debug -lfoliofs_c -o example && ./example IMAGE */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "foliofs.h"

#define CHECK(call)                                                            \
    do {                                                                       \
        long long result_ = (call);                                            \
        if (result_ < 0) {                                                     \
            fprintf(stderr, "%s: %s (errno %lld)\n", #call,                    \
                    foliofs_last_error(), -result_);                           \
            return 1;                                                          \
        }                                                                      \
    } while (0)

int main(int argc, char **argv) {
    const char *image = argc > 1 ? argv[1] : "example.img";
    struct FoliofsVolume *volume = NULL;
    struct FoliofsFile *file = NULL;
    struct FoliofsDir *dir = NULL;
    struct FoliofsDirEntry entry;
    struct FoliofsMkfsOptions mkfs;
    struct FoliofsStat stat;
    char back[16] = {0};
    const char text[] = "hello from C";

    CHECK(foliofs_mkfs_options_default(&mkfs));
    mkfs.block_bytes = 16384;
    CHECK(foliofs_mkfs_with_options(image, 64 << 20, &mkfs, NULL));
    CHECK(foliofs_volume_open_with_options(image, "commit_interval_ms=1000", &volume));
    CHECK(foliofs_mkdir(volume, "/docs"));
    CHECK(foliofs_file_open(volume, "/docs/hello.txt", O_RDWR | O_CREAT, 0644, &file));
    CHECK(foliofs_file_pwrite(file, (const unsigned char *)text, strlen(text), 0));
    CHECK(foliofs_file_sync_data(file));
    long long read = foliofs_file_pread(file, (unsigned char *)back, sizeof back - 1, 0);
    CHECK(read);
    CHECK(foliofs_stat(volume, "/docs/hello.txt", &stat));
    printf("read %lld bytes: %s; size %llu, mode %o, blksize %u\n", read, back,
           (unsigned long long)stat.size, (unsigned)stat.mode, (unsigned)stat.blksize);
    if (read != (long long)strlen(text) || strcmp(back, text) != 0 || !S_ISREG(stat.mode) ||
        stat.blksize != 16384) {
        fprintf(stderr, "wrong data or attributes\n");
        return 1;
    }

    /* ftruncate, then fsync. */
    CHECK(foliofs_file_set_len(file, 5));
    CHECK(foliofs_file_sync(file));
    CHECK(foliofs_file_close(file));
    CHECK(foliofs_stat(volume, "/docs/hello.txt", &stat));
    printf("truncated to %llu\n", (unsigned long long)stat.size);

    /* readdir: the entries (no "." or ".."), with their inode and type. */
    CHECK(foliofs_dir_open(volume, "/docs", &dir));
    int more;
    while ((more = foliofs_dir_next(dir, &entry)) == 1) {
        printf("entry %s ino %llu %s\n", entry.name, (unsigned long long)entry.ino,
               entry.kind == DT_DIR ? "dir" : entry.kind == DT_REG ? "file" : "other");
    }
    CHECK(more);
    CHECK(foliofs_dir_close(dir));

    /* Errors are negative errnos, with a message for this thread. */
    int missing = foliofs_file_open(volume, "/nope", O_RDONLY, 0, &file);
    printf("missing: %d (%s)\n", missing, foliofs_last_error());
    struct FoliofsVolume *again = NULL;
    int bad_option = foliofs_volume_open_with_options(image, "no_such_option", &again);
    printf("bad option: %d (%s)\n", bad_option, foliofs_last_error());
    int exists = foliofs_file_open(volume, "/docs/hello.txt", O_WRONLY | O_CREAT | O_EXCL, 0644, &file);
    int not_empty = foliofs_rmdir(volume, "/docs");
    if (missing != -ENOENT || exists != -EEXIST || not_empty != -ENOTEMPTY ||
        bad_option != -EINVAL) {
        fprintf(stderr, "unexpected errnos %d %d %d %d\n", missing, exists, not_empty,
                bad_option);
        return 1;
    }
    CHECK(foliofs_rename(volume, "/docs/hello.txt", "/hello.txt"));
    CHECK(foliofs_rmdir(volume, "/docs"));
    CHECK(foliofs_unlink(volume, "/hello.txt"));
    CHECK(foliofs_volume_close(volume));
    printf("ok\n");
    return 0;
}
