#include "fuse_fs.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <memory>

namespace vfio_agent::sim {
namespace {

// Reply layout of FUSE_OPEN (include/uapi/linux/fuse.h). Built by hand because libfuse 3.14 cannot set
// FOPEN_PARALLEL_DIRECT_WRITES, without which the kernel serialises all writes to one inode: a blocked
// unbind of one device would then block the unbind of every other device written through the same
// drivers/<drv>/unbind file, which real sysfs does not do.
struct OpenOut {
  uint64_t fh;
  uint32_t open_flags;
  uint32_t padding;
};
constexpr uint32_t kFopenDirectIo = 1u << 0;
constexpr double kEntryTimeoutSeconds = 3600;
constexpr uint32_t kFopenParallelDirectWrites = 1u << 6;

struct OpenFile : Handle {
  std::string content;
  Attr attr = Attr::kNone;
  std::string key;
};

struct DirListing : Handle {
  std::vector<std::pair<std::string, struct stat>> entries;
};

FuseFs& Fs(fuse_req_t req) { return *static_cast<FuseFs*>(fuse_req_userdata(req)); }

std::string ChildPath(const std::string& dir, const char* name) {
  return dir == "/" ? std::string("/") + name : dir + "/" + name;
}

// Resolves an inode against the current snapshot; replies ENOENT itself when it is gone.
const Entry* Resolve(fuse_req_t req, fuse_ino_t ino, std::shared_ptr<const Tree>& snap, std::string& path) {
  snap = Fs(req).kernel().Snapshot();
  if (Fs(req).PathOf(ino, path)) {
    if (auto it = snap->find(path); it != snap->end()) return &it->second;
  }
  fuse_reply_err(req, ENOENT);
  return nullptr;
}

// With atomic O_TRUNC the kernel sets i_size to 0 on `open(O_TRUNC)` (every shell `>`), and a write past
// i_size takes the exclusive inode lock even with parallel direct writes. Without it the truncate becomes a
// SETATTR whose reply restores the 4096-byte size.
void Init(void*, fuse_conn_info* conn) { conn->want &= ~FUSE_CAP_ATOMIC_O_TRUNC; }

void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  std::string dir;
  if (!Fs(req).PathOf(parent, dir)) return (void)fuse_reply_err(req, ENOENT);
  const std::string path = ChildPath(dir, name);
  auto snap = Fs(req).kernel().Snapshot();
  auto it = snap->find(path);
  if (it == snap->end()) return (void)fuse_reply_err(req, ENOENT);
  fuse_entry_param e{};
  e.ino = Fs(req).Inode(path);
  e.generation = 1;
  e.attr = Fs(req).Stat(it->second, e.ino);
  // Names stay cached in the kernel, as kernfs keeps its dentries, yet every operation on an inode (open,
  // readlink, readdir, getattr: attr_timeout is 0) is answered from the current snapshot by path, so a
  // name that vanished fails with ENOENT at once and one that appears is looked up afresh (ENOENT replies
  // are never cached). Without this every path component costs a round trip, ten times what sysfs costs.
  e.entry_timeout = kEntryTimeoutSeconds;
  fuse_reply_entry(req, &e);
}

void GetAttr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  std::shared_ptr<const Tree> snap;
  std::string path;
  if (const Entry* e = Resolve(req, ino, snap, path)) {
    struct stat st = Fs(req).Stat(*e, ino);
    fuse_reply_attr(req, &st, 0);
  }
}

// truncate/chmod on sysfs attributes are accepted and change nothing (`echo x > attr` truncates first).
void SetAttr(fuse_req_t req, fuse_ino_t ino, struct stat*, int, fuse_file_info* fi) { GetAttr(req, ino, fi); }

void ReadLink(fuse_req_t req, fuse_ino_t ino) {
  std::shared_ptr<const Tree> snap;
  std::string path;
  const Entry* e = Resolve(req, ino, snap, path);
  if (!e) return;
  if (e->type != Entry::Type::kLink) return (void)fuse_reply_err(req, EINVAL);
  fuse_reply_readlink(req, e->content.c_str());
}

void Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  std::shared_ptr<const Tree> snap;
  std::string path;
  const Entry* e = Resolve(req, ino, snap, path);
  if (!e) return;
  if (e->type == Entry::Type::kDir) return (void)fuse_reply_err(req, EISDIR);
  const int mode = fi->flags & O_ACCMODE;
  if ((mode != O_RDONLY && !(e->mode & 0222)) || (mode != O_WRONLY && !(e->mode & 0444))) {
    return (void)fuse_reply_err(req, EACCES);  // kernfs refuses opens the attribute has no method for
  }
  if (e->attr == Attr::kConfig && mode != O_WRONLY) Fs(req).kernel().WakeForConfigRead(e->key);
  auto file = std::make_unique<OpenFile>();
  file->content = e->live_log ? Fs(req).kernel().LogText() : e->content;
  file->attr = e->attr;
  file->key = e->key;
  OpenOut out{Fs(req).Adopt(std::move(file)), kFopenDirectIo | kFopenParallelDirectWrites, 0};
  if (fuse_reply_buf(req, reinterpret_cast<const char*>(&out), sizeof out) != 0) Fs(req).Drop(out.fh);
}

void Read(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  const auto* file = reinterpret_cast<const OpenFile*>(fi->fh);
  if (off < 0 || static_cast<size_t>(off) >= file->content.size()) return (void)fuse_reply_buf(req, nullptr, 0);
  // Reply from a copy: once the kernel has the reply the reader may close, and RELEASE may free `file`
  // before fuse_reply_buf() has returned.
  const std::string chunk = file->content.substr(static_cast<size_t>(off), size);
  fuse_reply_buf(req, chunk.data(), chunk.size());
}

void Write(fuse_req_t req, fuse_ino_t, const char* buf, size_t size, off_t, fuse_file_info* fi) {
  const auto* file = reinterpret_cast<const OpenFile*>(fi->fh);
  // Writable attributes the sim does not model (numa_node, config, uevent) refuse rather than pretend.
  if (file->attr == Attr::kNone) return (void)fuse_reply_err(req, EPERM);
  const int err = Fs(req).kernel().Write(file->attr, file->key, absl::string_view(buf, size));
  if (err) return (void)fuse_reply_err(req, err);
  fuse_reply_write(req, size);
}

void Release(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  Fs(req).Drop(fi->fh);
  fuse_reply_err(req, 0);
}

void OpenDir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  std::shared_ptr<const Tree> snap;
  std::string path;
  const Entry* e = Resolve(req, ino, snap, path);
  if (!e) return;
  if (e->type != Entry::Type::kDir) return (void)fuse_reply_err(req, ENOTDIR);
  auto listing = std::make_unique<DirListing>();
  struct stat dot = Fs(req).Stat(*e, ino);
  listing->entries.emplace_back(".", dot);
  listing->entries.emplace_back("..", dot);
  for (const auto& name : e->children) {
    const std::string child = ChildPath(path, name.c_str());
    const fuse_ino_t child_ino = Fs(req).Inode(child);
    listing->entries.emplace_back(name, Fs(req).Stat(snap->at(child), child_ino));
  }
  fi->fh = Fs(req).Adopt(std::move(listing));
  if (fuse_reply_open(req, fi) != 0) Fs(req).Drop(fi->fh);
}

void ReadDir(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  const auto* listing = reinterpret_cast<const DirListing*>(fi->fh);
  std::string buf(size, '\0');
  size_t used = 0;
  for (size_t i = static_cast<size_t>(off); i < listing->entries.size(); ++i) {
    const auto& [name, st] = listing->entries[i];
    const size_t need = fuse_add_direntry(req, buf.data() + used, size - used, name.c_str(), &st,
                                          static_cast<off_t>(i + 1));
    if (need > size - used) break;
    used += need;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void ReleaseDir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  Fs(req).Drop(fi->fh);
  fuse_reply_err(req, 0);
}

}  // namespace

FuseFs::FuseFs(Kernel& kernel) : kernel_(kernel), paths_{"", "/"} {
  inodes_["/"] = FUSE_ROOT_ID;
  clock_gettime(CLOCK_REALTIME, &started_);
}

fuse_ino_t FuseFs::Inode(const std::string& path) {
  std::lock_guard lock(mu_);
  auto [it, inserted] = inodes_.try_emplace(path, paths_.size());
  if (inserted) paths_.push_back(path);
  return it->second;
}

uint64_t FuseFs::Adopt(std::unique_ptr<Handle> handle) {
  const auto fh = reinterpret_cast<uint64_t>(handle.get());
  std::lock_guard lock(mu_);
  handles_.emplace(fh, std::move(handle));
  return fh;
}

void FuseFs::Drop(uint64_t fh) {
  std::unique_ptr<Handle> dropped;  // destroyed outside the lock
  std::lock_guard lock(mu_);
  if (auto it = handles_.find(fh); it != handles_.end()) {
    dropped = std::move(it->second);
    handles_.erase(it);
  }
}

bool FuseFs::PathOf(fuse_ino_t ino, std::string& path) {
  std::lock_guard lock(mu_);
  if (ino == 0 || ino >= paths_.size()) return false;
  path = paths_[ino];
  return true;
}

struct stat FuseFs::Stat(const Entry& entry, fuse_ino_t ino) const {
  struct stat st {};
  st.st_ino = ino;
  st.st_atim = st.st_mtim = st.st_ctim = started_;
  switch (entry.type) {
    case Entry::Type::kDir:
      st.st_mode = S_IFDIR | entry.mode;
      st.st_nlink = 2;
      break;
    case Entry::Type::kFile:
      st.st_mode = S_IFREG | entry.mode;
      st.st_nlink = 1;
      st.st_size = 4096;  // what sysfs reports for every attribute
      break;
    case Entry::Type::kLink:
      st.st_mode = S_IFLNK | 0777;
      st.st_nlink = 1;
      st.st_size = static_cast<off_t>(entry.content.size());
      break;
  }
  return st;
}

const fuse_lowlevel_ops& FuseFs::Ops() {
  static const fuse_lowlevel_ops ops = [] {
    fuse_lowlevel_ops o{};
    o.init = Init;
    o.lookup = Lookup;
    o.getattr = GetAttr;
    o.setattr = SetAttr;
    o.readlink = ReadLink;
    o.open = Open;
    o.read = Read;
    o.write = Write;
    o.release = Release;
    o.opendir = OpenDir;
    o.readdir = ReadDir;
    o.releasedir = ReleaseDir;
    return o;
  }();
  return ops;
}

}  // namespace vfio_agent::sim
