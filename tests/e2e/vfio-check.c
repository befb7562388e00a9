/* vfio-check <BDF> [--dma]
 *
 * Proves from user space that a device the agent bound is really usable through VFIO, the way QEMU would use it:
 * open the container and the device's group, require the group to be viable, attach the container to the type1
 * IOMMU, get the device fd and read the vendor/device ids through the VFIO config region. For QEMU's `edu`
 * device (1234:11e8) it also maps BAR0 and, with --dma, runs a RAM -> device -> RAM DMA round trip through the
 * IOMMU, which only works when the IOMMU mapping made through the container is real.
 *
 * Built static by scripts/e2e-qemu.sh and run inside the QEMU guest (no libc in the initramfs).
 * Exit: 0 usable, 2 group not viable, 1 any other failure. One "vfio-check:" line per step on stdout.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/vfio.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define FAIL(...)                                                             \
  do {                                                                        \
    int saved = errno;                                                        \
    printf("vfio-check: %s: ", bdf);                                          \
    printf(__VA_ARGS__);                                                      \
    printf(" failed: %s\n", strerror(saved));                                 \
    exit(1);                                                                  \
  } while (0)

static const char *bdf;

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static const char *group_of(const char *device) {
  static char link[256];
  char path[256];
  snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/iommu_group", device);
  ssize_t n = readlink(path, link, sizeof link - 1);
  if (n < 0) FAIL("readlink %s", path);
  link[n] = 0;
  const char *slash = strrchr(link, '/');
  return slash ? slash + 1 : link;
}

/* edu: BAR0 0x00 identification, 0x04 liveness (reads back the complement), 0x80..0x98 DMA engine. */
static int check_edu(int container, int device, const struct vfio_region_info *config, int want_dma) {
  struct vfio_region_info bar = {.argsz = sizeof bar, .index = VFIO_PCI_BAR0_REGION_INDEX};
  if (ioctl(device, VFIO_DEVICE_GET_REGION_INFO, &bar)) FAIL("VFIO_DEVICE_GET_REGION_INFO(BAR0)");
  volatile uint8_t *mmio = mmap(NULL, bar.size, PROT_READ | PROT_WRITE, MAP_SHARED, device, bar.offset);
  if (mmio == MAP_FAILED) FAIL("mmap BAR0");
#define REG32(off) (*(volatile uint32_t *)(mmio + (off)))
#define REG64(off) (*(volatile uint64_t *)(mmio + (off)))
  REG32(0x04) = 0x12345678;
  uint32_t liveness = REG32(0x04);
  int live = liveness == (uint32_t)~0x12345678u;
  printf("vfio-check: %s edu BAR0 mmap id=0x%08x liveness=%s\n", bdf, REG32(0x00), live ? "ok" : "BAD");
  if (!live) return 1;
  if (!want_dma) return 0;

  /* One page at IOVA 1 MiB: edu's DMA mask is 28 bits. */
  const uint64_t iova = 0x100000, page = 4096, edu_buffer = 0x40000, len = 64;
  uint8_t *buf = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buf == MAP_FAILED) FAIL("mmap DMA page");
  for (unsigned i = 0; i < page / 2; i++) buf[i] = (uint8_t)(i * 7 + 3);
  struct vfio_iommu_type1_dma_map map = {.argsz = sizeof map,
                                         .flags = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
                                         .vaddr = (uintptr_t)buf, .iova = iova, .size = page};
  if (ioctl(container, VFIO_IOMMU_MAP_DMA, &map)) FAIL("VFIO_IOMMU_MAP_DMA");
  uint16_t command;
  if (pread(device, &command, 2, config->offset + 4) != 2) FAIL("read PCI command");
  command |= 0x6; /* memory space + bus master, or the device cannot DMA */
  if (pwrite(device, &command, 2, config->offset + 4) != 2) FAIL("write PCI command");
  REG64(0x80) = iova;            REG64(0x88) = edu_buffer;             REG64(0x90) = len; REG64(0x98) = 1;
  for (int i = 0; i < 200 && (REG64(0x98) & 1); i++) sleep_ms(10);
  REG64(0x80) = edu_buffer;      REG64(0x88) = iova + page / 2;        REG64(0x90) = len; REG64(0x98) = 1 | 2;
  for (int i = 0; i < 200 && (REG64(0x98) & 1); i++) sleep_ms(10);
  int same = memcmp(buf, buf + page / 2, len) == 0;
  printf("vfio-check: %s edu DMA round trip through the IOMMU: %s\n", bdf, same ? "ok" : "MISMATCH");
  return same ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s <BDF> [--dma]\n", argv[0]);
    return 1;
  }
  bdf = argv[1];
  int want_dma = argc > 2 && strcmp(argv[2], "--dma") == 0;

  const char *group_id = group_of(bdf);
  int container = open("/dev/vfio/vfio", O_RDWR);
  if (container < 0) FAIL("open /dev/vfio/vfio");
  if (ioctl(container, VFIO_GET_API_VERSION) != VFIO_API_VERSION) FAIL("VFIO_GET_API_VERSION");
  char group_path[300];
  snprintf(group_path, sizeof group_path, "/dev/vfio/%s", group_id);
  int group = open(group_path, O_RDWR);
  if (group < 0) FAIL("open %s", group_path);

  struct vfio_group_status status = {.argsz = sizeof status};
  if (ioctl(group, VFIO_GROUP_GET_STATUS, &status)) FAIL("VFIO_GROUP_GET_STATUS");
  if (!(status.flags & VFIO_GROUP_FLAGS_VIABLE)) {
    printf("vfio-check: %s group %s NOT viable (a member is still on a host driver)\n", bdf, group_id);
    return 2;
  }
  if (ioctl(group, VFIO_GROUP_SET_CONTAINER, &container)) FAIL("VFIO_GROUP_SET_CONTAINER");
  if (ioctl(container, VFIO_SET_IOMMU, VFIO_TYPE1v2_IOMMU) && ioctl(container, VFIO_SET_IOMMU, VFIO_TYPE1_IOMMU))
    FAIL("VFIO_SET_IOMMU");
  int device = ioctl(group, VFIO_GROUP_GET_DEVICE_FD, bdf);
  if (device < 0) FAIL("VFIO_GROUP_GET_DEVICE_FD");

  struct vfio_device_info info = {.argsz = sizeof info};
  if (ioctl(device, VFIO_DEVICE_GET_INFO, &info)) FAIL("VFIO_DEVICE_GET_INFO");
  if (!(info.flags & VFIO_DEVICE_FLAGS_PCI)) FAIL("VFIO_DEVICE_GET_INFO says not a PCI device");
  struct vfio_region_info config = {.argsz = sizeof config, .index = VFIO_PCI_CONFIG_REGION_INDEX};
  if (ioctl(device, VFIO_DEVICE_GET_REGION_INFO, &config)) FAIL("VFIO_DEVICE_GET_REGION_INFO(config)");
  uint16_t ids[2];
  if (pread(device, ids, sizeof ids, config.offset) != sizeof ids) FAIL("read config space");
  printf("vfio-check: %s group %s viable, container on type1 IOMMU, device fd ok, ids %04x:%04x\n", bdf, group_id,
         ids[0], ids[1]);

  if (ids[0] == 0x1234 && ids[1] == 0x11e8) return check_edu(container, device, &config, want_dma);
  return 0;
}
