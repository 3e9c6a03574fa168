/* Every call of include/foliofs.h from C, with its results checked: mkfs
 * options, volume options (bad ones, read-only), directory listings,
 * ftruncate, fdatasync, fstat, chmod, links, statfs, the metadata room,
 * and the -EINVAL that null pointers and non-UTF-8 options get. Built and
 * run by tests/c_example.rs:
 *   cc api.c -Iinclude -Ltarget/debug -lfoliofs_c -o api && ./api IMAGE */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "foliofs.h"

static int failures = 0;

/* `call` must give exactly `expected`. */
#define EXPECT(call, expected)                                                 \
    do {                                                                       \
        long long got_ = (call), want_ = (expected);                           \
        if (got_ != want_) {                                                   \
            fprintf(stderr, "%s:%d: %s = %lld, expected %lld (%s)\n",          \
                    __FILE__, __LINE__, #call, got_, want_,                    \
                    foliofs_last_error());                                     \
            failures++;                                                        \
        }                                                                      \
    } while (0)

/* `condition` must hold. */
#define ASSERT(condition)                                                      \
    do {                                                                       \
        if (!(condition)) {                                                    \
            fprintf(stderr, "%s:%d: %s does not hold\n", __FILE__, __LINE__,   \
                    #condition);                                               \
            failures++;                                                        \
        }                                                                      \
    } while (0)

/* A call that later steps depend on: stop if it fails. */
#define MUST(call)                                                             \
    do {                                                                       \
        long long got_ = (call);                                               \
        if (got_ < 0) {                                                        \
            fprintf(stderr, "%s:%d: %s failed: %lld (%s)\n", __FILE__,         \
                    __LINE__, #call, got_, foliofs_last_error());              \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

struct expected_entry {
    const char *name;
    unsigned char kind;
    int seen;
};

/* Lists `path` and checks it holds exactly `expected` (any order), each
 * with its type and the inode number lstat gives. */
static void check_listing(struct FoliofsVolume *volume, const char *path,
                          struct expected_entry *expected, size_t count) {
    struct FoliofsDir *dir = NULL;
    struct FoliofsDirEntry entry;
    size_t listed = 0;
    int more;
    for (size_t i = 0; i < count; i++) {
        expected[i].seen = 0;
    }
    MUST(foliofs_dir_open(volume, path, &dir));
    while ((more = foliofs_dir_next(dir, &entry)) == 1) {
        size_t i;
        listed++;
        ASSERT(strlen(entry.name) == entry.name_len);
        for (i = 0; i < count; i++) {
            if (strcmp(expected[i].name, entry.name) == 0) {
                break;
            }
        }
        if (i == count) {
            fprintf(stderr, "%s lists an unexpected %s\n", path, entry.name);
            failures++;
            continue;
        }
        expected[i].seen++;
        EXPECT(entry.kind, expected[i].kind);
        char full[256];
        struct FoliofsStat stat;
        snprintf(full, sizeof full, "%s/%s", path, entry.name);
        MUST(foliofs_lstat(volume, full, &stat));
        EXPECT(entry.ino, stat.ino);
    }
    EXPECT(more, 0);
    /* The end stays the end. */
    EXPECT(foliofs_dir_next(dir, &entry), 0);
    EXPECT(listed, count);
    for (size_t i = 0; i < count; i++) {
        EXPECT(expected[i].seen, 1);
    }
    EXPECT(foliofs_dir_close(dir), 0);
}

static struct FoliofsFile *create_file(struct FoliofsVolume *volume, const char *path,
                                       const char *text) {
    struct FoliofsFile *file = NULL;
    MUST(foliofs_file_open(volume, path, O_RDWR | O_CREAT | O_EXCL, 0644, &file));
    EXPECT(foliofs_file_pwrite(file, (const unsigned char *)text, strlen(text), 0),
           (long long)strlen(text));
    return file;
}

/* Formats `image` (64 MiB, 4 KiB blocks) with `metadata_bytes` of room for
 * metadata (0: the default) and returns how many more inodes statfs says
 * fit. */
static unsigned long long free_inodes_with_metadata_room(const char *image,
                                                         unsigned long long metadata_bytes) {
    struct FoliofsMkfsOptions mkfs;
    struct FoliofsVolume *volume = NULL;
    struct FoliofsStatFs statfs;
    MUST(foliofs_mkfs_options_default(&mkfs));
    mkfs.metadata_bytes = metadata_bytes;
    MUST(foliofs_mkfs_with_options(image, 64 << 20, &mkfs, "direct=off"));
    MUST(foliofs_volume_open_with_options(image, "direct=off", &volume));
    MUST(foliofs_statfs(volume, &statfs));
    MUST(foliofs_volume_close(volume));
    return statfs.free_inodes;
}

int main(int argc, char **argv) {
    const char *image = argc > 1 ? argv[1] : "api.img";
    struct FoliofsVolume *volume = NULL;
    struct FoliofsFile *file = NULL;
    struct FoliofsDir *dir = NULL;
    struct FoliofsDirEntry entry;
    struct FoliofsStat stat;
    struct FoliofsStatFs statfs;
    struct FoliofsMkfsOptions mkfs;
    unsigned char buffer[4096];
    char link_target[64];

    /* mkfs: the defaults, a bad block size, a bad option, then 16 KiB blocks. */
    EXPECT(foliofs_mkfs_options_default(NULL), -EINVAL);
    MUST(foliofs_mkfs_options_default(&mkfs));
    EXPECT(mkfs.block_bytes, 4096);
    EXPECT(mkfs.journal_bytes, 0);
    EXPECT(mkfs.metadata_bytes, 0);
    EXPECT(mkfs.root_uid, geteuid());
    EXPECT(mkfs.root_gid, getegid());
    mkfs.block_bytes = 3000;
    EXPECT(foliofs_mkfs_with_options(image, 64 << 20, &mkfs, "direct=off"), -EINVAL);
    ASSERT(strstr(foliofs_last_error(), "block size 3000") != NULL);
    mkfs.block_bytes = 16384;
    EXPECT(foliofs_mkfs_with_options(image, 64 << 20, &mkfs, "bogus_key=1"), -EINVAL);
    ASSERT(strstr(foliofs_last_error(), "bogus_key") != NULL);
    EXPECT(foliofs_mkfs_with_options(NULL, 64 << 20, &mkfs, NULL), -EINVAL);
    MUST(foliofs_mkfs_with_options(image, 64 << 20, &mkfs, "direct=off"));

    /* Volume options: bad keys and values, non-UTF-8 and null pointers are
     * -EINVAL and leave the out-pointer alone. */
    EXPECT(foliofs_volume_open_with_options(image, "no_such_option", &volume), -EINVAL);
    ASSERT(strstr(foliofs_last_error(), "no_such_option") != NULL);
    EXPECT(foliofs_volume_open_with_options(image, "io_threads=0", &volume), -EINVAL);
    EXPECT(foliofs_volume_open_with_options(image, "engine=warp", &volume), -EINVAL);
    EXPECT(foliofs_volume_open_with_options(image, "ro,\xff\xfe", &volume), -EINVAL);
    ASSERT(strstr(foliofs_last_error(), "UTF-8") != NULL);
    EXPECT(foliofs_volume_open_with_options(NULL, NULL, &volume), -EINVAL);
    EXPECT(foliofs_volume_open_with_options(image, NULL, NULL), -EINVAL);
    ASSERT(volume == NULL);
    MUST(foliofs_volume_open_with_options(image, "engine=sync,direct=off", &volume));

    MUST(foliofs_statfs(volume, &statfs));
    EXPECT(statfs.block_bytes, 16384);
    ASSERT(statfs.name_max >= 255);
    ASSERT(statfs.blocks > 0 && statfs.free_blocks <= statfs.blocks);
    ASSERT(statfs.available_blocks <= statfs.free_blocks);
    ASSERT(statfs.inodes >= 1);
    EXPECT(foliofs_statfs(volume, NULL), -EINVAL);
    EXPECT(foliofs_statfs(NULL, &statfs), -EINVAL);

    /* A tree to list: files, a directory, a symlink, a hard link. */
    MUST(foliofs_mkdir(volume, "/d"));
    MUST(foliofs_mkdir(volume, "/d/sub"));
    file = create_file(volume, "/d/a", "alpha");
    MUST(foliofs_file_close(file));
    file = create_file(volume, "/d/b", "beta");
    MUST(foliofs_file_close(file));
    MUST(foliofs_symlink(volume, "a", "/d/link"));
    MUST(foliofs_link(volume, "/d/a", "/d/hard"));
    EXPECT(foliofs_symlink(volume, "a", "/d/link"), -EEXIST);
    EXPECT(foliofs_link(volume, "/d/nope", "/d/hard2"), -ENOENT);

    struct expected_entry tree[] = {
        {"a", DT_REG, 0},   {"b", DT_REG, 0},    {"sub", DT_DIR, 0},
        {"link", DT_LNK, 0}, {"hard", DT_REG, 0},
    };
    check_listing(volume, "/d", tree, sizeof tree / sizeof tree[0]);
    struct expected_entry root[] = {{"d", DT_DIR, 0}};
    check_listing(volume, "/", root, 1);
    check_listing(volume, "/d/sub", NULL, 0);

    /* The listing is what it was at open; the names live until close. */
    MUST(foliofs_dir_open(volume, "/d/sub", &dir));
    file = create_file(volume, "/d/sub/late", "x");
    MUST(foliofs_file_close(file));
    EXPECT(foliofs_dir_next(dir, &entry), 0);
    EXPECT(foliofs_dir_close(dir), 0);
    MUST(foliofs_dir_open(volume, "/d/sub", &dir));
    EXPECT(foliofs_dir_next(dir, &entry), 1);
    EXPECT(strcmp(entry.name, "late"), 0);
    EXPECT(entry.kind, DT_REG);
    EXPECT(foliofs_dir_next(dir, &entry), 0);
    EXPECT(foliofs_dir_next(dir, NULL), -EINVAL);
    EXPECT(foliofs_dir_close(dir), 0);
    MUST(foliofs_unlink(volume, "/d/sub/late"));

    /* Clones: a whole file, then a range; a misaligned one is -EINVAL. */
    MUST(foliofs_clone_file(volume, "/d/a", "/d/a-clone"));
    EXPECT(foliofs_clone_file(volume, "/d/a", "/d/a-clone"), -EEXIST);
    EXPECT(foliofs_clone_tree(volume, "/d", "/d-snapshot") > 1, 1);
    EXPECT(foliofs_clone_tree(volume, "/d", "/d-snapshot"), -EEXIST);
    struct FoliofsFile *source = NULL;
    struct FoliofsFile *target = NULL;
    MUST(foliofs_file_open(volume, "/d/a-clone", O_RDONLY, 0, &source));
    EXPECT(foliofs_file_pread(source, buffer, sizeof buffer, 0), 5);
    EXPECT(memcmp(buffer, "alpha", 5), 0);
    MUST(foliofs_file_open(volume, "/d/ranges", O_RDWR | O_CREAT | O_EXCL, 0644, &target));
    EXPECT(foliofs_file_clone_range(target, source, 0, 16384, 0), 5);
    EXPECT(foliofs_file_clone_range(target, source, 1, 0, 4), -EINVAL);
    EXPECT(foliofs_file_copy_range(target, source, 1, 3, 100), 4);
    EXPECT(foliofs_file_pread(target, buffer, 7, 0), 7);
    EXPECT(memcmp(buffer, "\0\0\0lpha", 7), 0);
    EXPECT(foliofs_file_pread(target, buffer, 5, 16384), 5);
    EXPECT(memcmp(buffer, "alpha", 5), 0);
    MUST(foliofs_file_close(target));
    MUST(foliofs_file_close(source));
    MUST(foliofs_unlink(volume, "/d/ranges"));
    MUST(foliofs_unlink(volume, "/d/a-clone"));

    dir = NULL;
    EXPECT(foliofs_dir_open(volume, "/d/a", &dir), -ENOTDIR);
    EXPECT(foliofs_dir_open(volume, "/missing", &dir), -ENOENT);
    EXPECT(foliofs_dir_open(volume, "/d", NULL), -EINVAL);
    EXPECT(foliofs_dir_open(volume, NULL, &dir), -EINVAL);
    EXPECT(foliofs_dir_open(NULL, "/d", &dir), -EINVAL);
    ASSERT(dir == NULL);
    EXPECT(foliofs_dir_next(NULL, &entry), -EINVAL);
    EXPECT(foliofs_dir_close(NULL), -EINVAL);

    /* Symlinks: readlink, lstat against stat. */
    EXPECT(foliofs_readlink(volume, "/d/link", link_target, sizeof link_target), 1);
    EXPECT(link_target[0], 'a');
    EXPECT(foliofs_readlink(volume, "/d/link", NULL, 0), 1);
    EXPECT(foliofs_readlink(volume, "/d/a", link_target, sizeof link_target), -EINVAL);
    EXPECT(foliofs_readlink(volume, "/d/link", NULL, 1), -EINVAL);
    MUST(foliofs_lstat(volume, "/d/link", &stat));
    ASSERT(S_ISLNK(stat.mode));
    MUST(foliofs_stat(volume, "/d/link", &stat));
    ASSERT(S_ISREG(stat.mode));
    EXPECT(stat.size, 5);
    EXPECT(stat.nlink, 2);

    /* ftruncate, fdatasync, fstat, fchmod. */
    MUST(foliofs_file_open(volume, "/d/a", O_RDWR, 0, &file));
    memset(buffer, 'z', sizeof buffer);
    EXPECT(foliofs_file_pwrite(file, buffer, sizeof buffer, 0), (long long)sizeof buffer);
    EXPECT(foliofs_file_sync_data(file), 0);
    MUST(foliofs_file_stat(file, &stat));
    EXPECT(stat.size, 4096);
    EXPECT(stat.blksize, 16384);
    EXPECT(stat.nlink, 2);
    EXPECT(stat.uid, geteuid());
    ASSERT(S_ISREG(stat.mode));
    ASSERT(stat.mtime_sec > 0 && stat.atime_sec > 0 && stat.ctime_sec > 0);
    ASSERT(stat.mtime_nsec < 1000000000 && stat.atime_nsec < 1000000000 &&
           stat.ctime_nsec < 1000000000);
    EXPECT(stat.rdev, 0);
    EXPECT(foliofs_file_set_len(file, 100), 0);
    MUST(foliofs_file_stat(file, &stat));
    EXPECT(stat.size, 100);
    EXPECT(foliofs_file_pread(file, buffer, sizeof buffer, 0), 100);
    EXPECT(buffer[99], 'z');
    EXPECT(foliofs_file_set_len(file, 50000), 0);
    MUST(foliofs_stat(volume, "/d/hard", &stat));
    EXPECT(stat.size, 50000);
    memset(buffer, 'x', sizeof buffer);
    EXPECT(foliofs_file_pread(file, buffer, sizeof buffer, 40000), (long long)sizeof buffer);
    ASSERT(buffer[0] == 0 && buffer[sizeof buffer - 1] == 0);
    EXPECT(foliofs_file_pread(file, buffer, sizeof buffer, 49000), 1000);
    EXPECT(foliofs_file_sync(file), 0);
    EXPECT(foliofs_file_chmod(file, 0600), 0);
    MUST(foliofs_file_stat(file, &stat));
    EXPECT(stat.mode & 07777, 0600);
    MUST(foliofs_file_close(file));
    MUST(foliofs_file_open(volume, "/d/b", O_RDONLY, 0, &file));
    EXPECT(foliofs_file_set_len(file, 0), -EBADF);
    EXPECT(foliofs_file_sync_data(file), 0);
    MUST(foliofs_file_close(file));
    EXPECT(foliofs_chmod(volume, "/d/b", 0640), 0);
    MUST(foliofs_stat(volume, "/d/b", &stat));
    EXPECT(stat.mode & 07777, 0640);
    EXPECT(stat.size, 4);
    EXPECT(foliofs_chmod(volume, "/d/missing", 0640), -ENOENT);

    /* Null pointers are -EINVAL, never a crash. */
    EXPECT(foliofs_stat(volume, NULL, &stat), -EINVAL);
    EXPECT(foliofs_stat(NULL, "/d", &stat), -EINVAL);
    EXPECT(foliofs_stat(volume, "/d", NULL), -EINVAL);
    EXPECT(foliofs_lstat(volume, "/d", NULL), -EINVAL);
    EXPECT(foliofs_file_stat(NULL, &stat), -EINVAL);
    EXPECT(foliofs_file_set_len(NULL, 0), -EINVAL);
    EXPECT(foliofs_file_sync_data(NULL), -EINVAL);
    EXPECT(foliofs_file_chmod(NULL, 0600), -EINVAL);
    EXPECT(foliofs_chmod(volume, NULL, 0600), -EINVAL);
    EXPECT(foliofs_symlink(volume, NULL, "/d/l2"), -EINVAL);
    EXPECT(foliofs_link(volume, "/d/a", NULL), -EINVAL);
    EXPECT(foliofs_readlink(volume, NULL, link_target, sizeof link_target), -EINVAL);
    EXPECT(foliofs_volume_sync(NULL), -EINVAL);

    EXPECT(foliofs_volume_sync(volume), 0);
    MUST(foliofs_volume_close(volume));
    volume = NULL;

    /* Read-only: everything reads, every change is -EROFS. */
    MUST(foliofs_volume_open_with_options(image, "ro", &volume));
    check_listing(volume, "/d", tree, sizeof tree / sizeof tree[0]);
    MUST(foliofs_stat(volume, "/d/a", &stat));
    EXPECT(stat.size, 50000);
    EXPECT(stat.mode & 07777, 0600);
    MUST(foliofs_file_open(volume, "/d/b", O_RDONLY, 0, &file));
    EXPECT(foliofs_file_pread(file, buffer, sizeof buffer, 0), 4);
    EXPECT(memcmp(buffer, "beta", 4), 0);
    MUST(foliofs_file_close(file));
    file = NULL;
    EXPECT(foliofs_file_open(volume, "/d/new", O_WRONLY | O_CREAT, 0644, &file), -EROFS);
    EXPECT(foliofs_mkdir(volume, "/d/new"), -EROFS);
    EXPECT(foliofs_unlink(volume, "/d/b"), -EROFS);
    EXPECT(foliofs_rmdir(volume, "/d/sub"), -EROFS);
    EXPECT(foliofs_rename(volume, "/d/b", "/d/c"), -EROFS);
    EXPECT(foliofs_chmod(volume, "/d/b", 0600), -EROFS);
    EXPECT(foliofs_symlink(volume, "b", "/d/l2"), -EROFS);
    EXPECT(foliofs_link(volume, "/d/b", "/d/l2"), -EROFS);
    EXPECT(foliofs_file_open(volume, "/d/b", O_RDWR, 0, &file), -EROFS);
    EXPECT(foliofs_file_open(volume, "/d/b", O_WRONLY | O_TRUNC, 0, &file), -EROFS);
    ASSERT(file == NULL);
    MUST(foliofs_volume_close(volume));

    /* "ro" left the image as it was; "rw" opens it for writing again. */
    MUST(foliofs_volume_open_with_options(image, "ro=off,direct=off", &volume));
    MUST(foliofs_unlink(volume, "/d/hard"));
    MUST(foliofs_stat(volume, "/d/a", &stat));
    EXPECT(stat.nlink, 1);
    MUST(foliofs_volume_close(volume));

    /* The metadata room: below 1 MiB is refused; 4 MiB holds about four
     * times the inodes of the default (1 MiB on 64 MiB), each estimated at
     * 256 bytes. */
    MUST(foliofs_mkfs_options_default(&mkfs));
    mkfs.metadata_bytes = 1000;
    EXPECT(foliofs_mkfs_with_options(image, 64 << 20, &mkfs, "direct=off"), -EINVAL);
    ASSERT(strstr(foliofs_last_error(), "metadata size") != NULL);
    unsigned long long default_room = free_inodes_with_metadata_room(image, 0);
    unsigned long long larger_room = free_inodes_with_metadata_room(image, 4 << 20);
    ASSERT(default_room > 0 && default_room <= (1 << 20) / 256);
    ASSERT(larger_room > 3 * default_room && larger_room <= (4 << 20) / 256);

    if (failures != 0) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("api ok\n");
    return 0;
}
