/* The foliofs C ABI end to end: format an image, write a file, sync,
 * read it back, stat it, and see errors come back as negative errnos.
 * Built and run by tests/c_example.rs:
 *   cc example.c -Iinclude -Ltarget/debug -lfoliofs_c -o example && ./example IMAGE */
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
    struct FoliofsStat stat;
    char back[16] = {0};
    const char text[] = "hello from C";

    CHECK(foliofs_mkfs(image, 64 << 20));
    CHECK(foliofs_volume_open(image, &volume));
    CHECK(foliofs_mkdir(volume, "/docs"));
    CHECK(foliofs_file_open(volume, "/docs/hello.txt", O_RDWR | O_CREAT, 0644, &file));
    CHECK(foliofs_file_pwrite(file, (const unsigned char *)text, strlen(text), 0));
    CHECK(foliofs_file_sync(file));
    long long read = foliofs_file_pread(file, (unsigned char *)back, sizeof back - 1, 0);
    CHECK(read);
    CHECK(foliofs_file_close(file));
    CHECK(foliofs_stat(volume, "/docs/hello.txt", &stat));
    printf("read %lld bytes: %s; size %llu, mode %o\n", read, back,
           (unsigned long long)stat.size, (unsigned)stat.mode);
    if (read != (long long)strlen(text) || strcmp(back, text) != 0 || !S_ISREG(stat.mode)) {
        fprintf(stderr, "wrong data or attributes\n");
        return 1;
    }

    /* Errors are negative errnos, with a message for this thread. */
    int missing = foliofs_file_open(volume, "/nope", O_RDONLY, 0, &file);
    printf("missing: %d (%s)\n", missing, foliofs_last_error());
    int exists = foliofs_file_open(volume, "/docs/hello.txt", O_WRONLY | O_CREAT | O_EXCL, 0644, &file);
    int not_empty = foliofs_rmdir(volume, "/docs");
    if (missing != -ENOENT || exists != -EEXIST || not_empty != -ENOTEMPTY) {
        fprintf(stderr, "unexpected errnos %d %d %d\n", missing, exists, not_empty);
        return 1;
    }
    CHECK(foliofs_rename(volume, "/docs/hello.txt", "/hello.txt"));
    CHECK(foliofs_rmdir(volume, "/docs"));
    CHECK(foliofs_unlink(volume, "/hello.txt"));
    CHECK(foliofs_volume_close(volume));
    printf("ok\n");
    return 0;
}
