/*
 * ===========================================================================================
 *  TEST DOUBLE for pyxis/enroot.  This is NOT NVIDIA's pyxis and NOT enroot.
 * ===========================================================================================
 *  pytest-trtllm-slurm's dev cluster (tests/cluster/up) builds this SPANK plugin against
 *  Slurm's own spank.h and lists it in /etc/slurm/plugstack.conf, so that the REAL srun
 *  parses pyxis' options and the REAL slurmstepd acts on them. pyxis and enroot are not
 *  packaged for Debian; this double implements just enough of their behaviour for tests:
 *
 *    --container-image=IMAGE    IMAGE is looked up in the image store (images=DIR below):
 *                               docker://, "#" and "/" forms are the same image; an absolute
 *                               path is a rootfs directory. A missing image is an error:
 *                               nothing is ever pulled.
 *    --container-name=NAME      the container is kept (per job and node, like pyxis'
 *                               default container_scope=job) and reused by later steps with
 *                               the same name: no second import. An unnamed container is
 *                               removed when the step ends.
 *    --container-mounts=SRC:DST[:FLAGS],...   bind mounts (FLAGS "ro", "+"-separated).
 *    --container-workdir=PATH   working directory inside the container (default: the job's
 *                               cwd if it exists inside the container, else /).
 *    --container-writable / --container-readonly   the container's rootfs is read-only
 *                               unless --container-writable; writes persist in a named one.
 *    --container-env=NAME,...   these host values win over the image's /etc/environment
 *                               (otherwise the image's values win, as with pyxis).
 *
 *  "Import" = copy the image's rootfs into the container directory; every import appends
 *  one line to <state>/import.log so tests can assert that a step did NOT import again.
 *  A task runs in its own mount namespace: the container rootfs bind-mounted on itself,
 *  /dev /proc /sys and the requested mounts bound into it, remounted read-only unless
 *  writable, then chroot + chdir. The double needs root (the dev cluster's jobs run as root).
 *
 *  plugstack.conf:  required /path/pyxis_double.so images=DIR state=DIR [mounts=PATH,...]
 *  ("required": SPANK ignores the errors of an "optional" plugin, and a step whose container
 *  cannot be set up must fail.)
 *  mounts= are read-only "system mounts" bound into every container at their host paths
 *  (enroot's mounts.d does this on real clusters), e.g. the dir of the cluster's TaskProlog:
 *  slurmstepd runs the TaskProlog after the SPANK task hooks, i.e. inside the container.
 * ===========================================================================================
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(pyxis_test_double, 1);

static char *opt_image, *opt_name, *opt_mounts, *opt_workdir, *opt_env, *system_mounts;
static int opt_writable;
static char images_dir[PATH_MAX] = "/var/tmp/trtllm-devcluster/pyxis/images";
static char state_dir[PATH_MAX] = "/var/tmp/trtllm-devcluster/pyxis/state";
static char container_dir[PATH_MAX]; /* set by init_post_opt when a container is used */
static int container_unnamed;
/* init_post_opt's errors are reported by the first task: a failing init_post_opt only makes
 * srun say "Plugin initialization failed" (and exit 0); a failing task shows the message */
static char setup_error[2 * PATH_MAX];
#define SETUP_ERROR(...) snprintf(setup_error, sizeof(setup_error), __VA_ARGS__)

static int set_str(char **dst, const char *val)
{
	free(*dst);
	*dst = val ? strdup(val) : NULL;
	return 0;
}

static int cb_image(int v, const char *a, int r) { (void)v; (void)r; return set_str(&opt_image, a); }
static int cb_name(int v, const char *a, int r) { (void)v; (void)r; return set_str(&opt_name, a); }
static int cb_mounts(int v, const char *a, int r) { (void)v; (void)r; return set_str(&opt_mounts, a); }
static int cb_workdir(int v, const char *a, int r) { (void)v; (void)r; return set_str(&opt_workdir, a); }
static int cb_env(int v, const char *a, int r) { (void)v; (void)r; return set_str(&opt_env, a); }
static int cb_writable(int v, const char *a, int r) { (void)a; (void)r; opt_writable = v; return 0; }

static struct spank_option options[] = {
	{"container-image", "[USER@][REGISTRY#]IMAGE[:TAG]|PATH",
	 "[pyxis TEST DOUBLE] the image to use for the container filesystem", 1, 0, cb_image},
	{"container-name", "NAME",
	 "[pyxis TEST DOUBLE] name to use for saving and loading the container", 1, 0, cb_name},
	{"container-mounts", "SRC:DST[:FLAGS][,SRC:DST...]",
	 "[pyxis TEST DOUBLE] bind mount[s] inside the container", 1, 0, cb_mounts},
	{"container-workdir", "PATH",
	 "[pyxis TEST DOUBLE] working directory inside the container", 1, 0, cb_workdir},
	{"container-writable", NULL,
	 "[pyxis TEST DOUBLE] make the container filesystem writable", 0, 1, cb_writable},
	{"container-readonly", NULL,
	 "[pyxis TEST DOUBLE] make the container filesystem read-only", 0, 0, cb_writable},
	{"container-env", "NAME[,NAME...]",
	 "[pyxis TEST DOUBLE] names of environment variables to override with the host values",
	 1, 0, cb_env},
	SPANK_OPTIONS_TABLE_END
};

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	for (int i = 0; i < ac; i++) {
		if (!strncmp(av[i], "images=", 7))
			snprintf(images_dir, sizeof(images_dir), "%s", av[i] + 7);
		else if (!strncmp(av[i], "state=", 6))
			snprintf(state_dir, sizeof(state_dir), "%s", av[i] + 6);
		else if (!strncmp(av[i], "mounts=", 7))
			set_str(&system_mounts, av[i] + 7);
	}
	spank_context_t ctx = spank_context();
	if (ctx != S_CTX_LOCAL && ctx != S_CTX_REMOTE)
		return 0;
	for (struct spank_option *o = options; o->name; o++)
		if (spank_option_register(sp, o) != ESPANK_SUCCESS) {
			slurm_error("pyxis double: cannot register --%s", o->name);
			return -1;
		}
	return 0;
}

static int mkdir_p(const char *path, mode_t mode)
{
	char buf[PATH_MAX];
	snprintf(buf, sizeof(buf), "%s", path);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, mode) < 0 && errno != EEXIST)
			return -1;
		*p = '/';
	}
	if (mkdir(buf, mode) < 0 && errno != EEXIST)
		return -1;
	return 0;
}

static int run_argv(char *const argv[])
{
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		int fd = open("/dev/null", O_RDWR);
		if (fd >= 0) {
			dup2(fd, 0);
			dup2(fd, 1);
		}
		execv(argv[0], argv);
		_exit(127);
	}
	int status;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

static int is_dir(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static const char *node_name(void)
{
	const char *n = getenv("SLURMD_NODENAME"); /* slurmd exports it; slurmstepd inherits */
	static char host[256];
	if (n && *n)
		return n;
	gethostname(host, sizeof(host));
	return host;
}

/* image URI -> rootfs directory in the image store */
static int image_rootfs(const char *image, char *out, size_t len)
{
	const char *s = image;
	if (!strncmp(s, "docker://", 9))
		s += 9;
	if (s[0] == '/') {
		snprintf(out, len, "%s", s);
	} else {
		char key[PATH_MAX];
		size_t i = 0;
		for (; s[i] && i < sizeof(key) - 1; i++) {
			char c = s[i];
			key[i] = (isalnum((unsigned char)c) || c == '.' || c == '-' || c == '_') ? c : '_';
		}
		key[i] = '\0';
		snprintf(out, len, "%s/%s", images_dir, key);
	}
	return is_dir(out) ? 0 : -1;
}

static void log_import(uint32_t job, uint32_t step, const char *image)
{
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/import.log", state_dir);
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
	if (fd < 0)
		return;
	char line[2 * PATH_MAX];
	int n = snprintf(line, sizeof(line), "%ld node=%s job=%u step=%u name=%s image=%s\n",
			 (long)time(NULL), node_name(), job, step,
			 container_unnamed ? "-" : opt_name, image);
	if (n > 0 && write(fd, line, (size_t)n) < 0)
		slurm_error("pyxis double: cannot write %s", path);
	close(fd);
}

/* remote, privileged, once per step: find or import the container */
int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	(void)ac; (void)av;
	if (!spank_remote(sp) || (!opt_image && !opt_name))
		return 0;
	uint32_t job = 0, step = 0;
	spank_get_item(sp, S_JOB_ID, &job);
	spank_get_item(sp, S_JOB_STEPID, &step);
	char base[PATH_MAX];
	snprintf(base, sizeof(base), "%s/job%u/%s", state_dir, job, node_name());
	if (mkdir_p(base, 0755) < 0) {
		SETUP_ERROR("pyxis double: cannot create %s: %s", base, strerror(errno));
		return 0;
	}
	char dir[PATH_MAX]; /* becomes container_dir once the container exists */
	container_unnamed = opt_name == NULL;
	if (container_unnamed)
		snprintf(dir, sizeof(dir), "%s/.step%u", base, step);
	else
		snprintf(dir, sizeof(dir), "%s/%s", base, opt_name);

	char lockpath[PATH_MAX], done[PATH_MAX], rootfs[PATH_MAX];
	snprintf(lockpath, sizeof(lockpath), "%s/.lock", base);
	snprintf(done, sizeof(done), "%s/.complete", dir);
	snprintf(rootfs, sizeof(rootfs), "%s/rootfs", dir);
	int lock = open(lockpath, O_RDWR | O_CREAT, 0644);
	if (lock < 0 || flock(lock, LOCK_EX) < 0) {
		SETUP_ERROR("pyxis double: cannot lock %s: %s", lockpath, strerror(errno));
		return 0;
	}
	int rc = 0;
	if (access(done, F_OK) == 0)
		goto out; /* an existing named container: used as it is, no import */
	if (!opt_image) {
		SETUP_ERROR("pyxis: error: no container named \"%s\" on %s and no --container-image",
			    opt_name, node_name());
		rc = -1;
		goto out;
	}
	char src[PATH_MAX];
	if (image_rootfs(opt_image, src, sizeof(src)) < 0) {
		SETUP_ERROR("pyxis: error: image \"%s\" not found (test double: no rootfs at %s; "
			    "images are never pulled)", opt_image, src);
		rc = -1;
		goto out;
	}
	char tmp[PATH_MAX], from[PATH_MAX + 3];
	snprintf(tmp, sizeof(tmp), "%s.tmp", dir);
	snprintf(from, sizeof(from), "%s/.", src);
	char *rm[] = {"/bin/rm", "-rf", tmp, NULL};
	run_argv(rm);
	char *cp[] = {"/bin/cp", "-a", from, tmp, NULL};
	if (mkdir_p(dir, 0755) < 0 || run_argv(cp) < 0 ||
	    rename(tmp, rootfs) < 0) {
		SETUP_ERROR("pyxis double: import of %s into %s failed", opt_image, dir);
		rc = -1;
		goto out;
	}
	int fd = open(done, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd >= 0) {
		if (write(fd, opt_image, strlen(opt_image)) < 0)
			rc = -1;
		close(fd);
	}
	log_import(job, step, opt_image);
out:
	if (rc == 0) {
		snprintf(container_dir, sizeof(container_dir), "%s", dir);
	} else if (container_unnamed) {
		char *rm_dir[] = {"/bin/rm", "-rf", dir, NULL};
		run_argv(rm_dir);
	}
	flock(lock, LOCK_UN);
	close(lock);
	return 0;
}

static int bind_mount(const char *src, const char *dst, int ro)
{
	if (mount(src, dst, NULL, MS_BIND | MS_REC, NULL) < 0) {
		slurm_error("pyxis double: bind %s -> %s: %m", src, dst);
		return -1;
	}
	if (ro && mount(NULL, dst, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) < 0) {
		slurm_error("pyxis double: read-only remount of %s: %m", dst);
		return -1;
	}
	return 0;
}

static int mount_point(const char *root, const char *src, const char *dst, char *out, size_t len)
{
	snprintf(out, len, "%s%s", root, dst);
	struct stat st;
	if (stat(src, &st) < 0) {
		slurm_error("pyxis: error: mount source %s: %m", src);
		return -1;
	}
	if (S_ISDIR(st.st_mode))
		return mkdir_p(out, 0755);
	char parent[PATH_MAX];
	snprintf(parent, sizeof(parent), "%s", out);
	char *slash = strrchr(parent, '/');
	if (slash)
		*slash = '\0';
	if (mkdir_p(parent, 0755) < 0)
		return -1;
	int fd = open(out, O_WRONLY | O_CREAT, 0644);
	if (fd < 0)
		return -1;
	close(fd);
	return 0;
}

static int user_mounts(const char *root, const char *spec, int force_ro)
{
	if (!spec)
		return 0;
	char *list = strdup(spec), *save = NULL;
	int rc = 0;
	for (char *item = strtok_r(list, ",", &save); item && !rc; item = strtok_r(NULL, ",", &save)) {
		char *src = item, *dst = strchr(item, ':'), *flags = NULL;
		if (dst) {
			*dst++ = '\0';
			flags = strchr(dst, ':');
			if (flags)
				*flags++ = '\0';
		}
		if (!dst || !*dst)
			dst = src;
		int ro = force_ro;
		if (flags) {
			char *fsave = NULL;
			for (char *f = strtok_r(flags, "+", &fsave); f; f = strtok_r(NULL, "+", &fsave))
				if (!strcmp(f, "ro"))
					ro = 1;
		}
		char target[PATH_MAX];
		if (src[0] != '/' || dst[0] != '/') {
			slurm_error("pyxis: error: mount %s:%s: paths must be absolute", src, dst);
			rc = -1;
		} else if (mount_point(root, src, dst, target, sizeof(target)) < 0 ||
			   bind_mount(src, target, ro) < 0) {
			rc = -1;
		}
	}
	free(list);
	return rc;
}

static int listed(const char *name)
{
	if (!opt_env)
		return 0;
	size_t n = strlen(name);
	for (const char *p = opt_env; p && *p;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		if (len == n && !strncmp(p, name, n))
			return 1;
		p = end ? end + 1 : NULL;
	}
	return 0;
}

/* the image's /etc/environment wins over the job's env, except for --container-env names */
static void image_env(spank_t sp)
{
	FILE *fh = fopen("/etc/environment", "r");
	if (!fh)
		return;
	char line[8192];
	while (fgets(line, sizeof(line), fh)) {
		line[strcspn(line, "\n")] = '\0';
		char *eq = strchr(line, '=');
		if (!eq || line[0] == '#')
			continue;
		*eq = '\0';
		if (!listed(line))
			spank_setenv(sp, line, eq + 1, 1);
	}
	fclose(fh);
}

/* remote, per task, privileged: enter the container */
int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
	(void)ac; (void)av;
	if (setup_error[0]) {
		slurm_error("%s", setup_error);
		return -1;
	}
	if (!container_dir[0])
		return 0;
	char root[PATH_MAX], cwd[PATH_MAX], target[PATH_MAX];
	snprintf(root, sizeof(root), "%s/rootfs", container_dir);
	if (!getcwd(cwd, sizeof(cwd)))
		snprintf(cwd, sizeof(cwd), "/");
	if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
		slurm_error("pyxis double: new mount namespace: %m");
		return -1;
	}
	if (bind_mount(root, root, 0) < 0)
		return -1;
	const char *sys[] = {"/dev", "/proc", "/sys"};
	for (size_t i = 0; i < sizeof(sys) / sizeof(sys[0]); i++) {
		snprintf(target, sizeof(target), "%s%s", root, sys[i]);
		if (mkdir_p(target, 0755) < 0 || bind_mount(sys[i], target, 0) < 0)
			return -1;
	}
	if (user_mounts(root, system_mounts, 1) < 0 || user_mounts(root, opt_mounts, 0) < 0)
		return -1;
	if (opt_writable != 1 &&
	    mount(NULL, root, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) < 0) {
		slurm_error("pyxis double: read-only remount of %s: %m", root);
		return -1;
	}
	if (chroot(root) < 0) {
		slurm_error("pyxis double: chroot %s: %m", root);
		return -1;
	}
	const char *wd = opt_workdir ? opt_workdir : (is_dir(cwd) ? cwd : "/");
	if (chdir(wd) < 0) {
		slurm_error("pyxis: error: cannot chdir to %s inside the container: %m", wd);
		return -1;
	}
	image_env(sp);
	spank_setenv(sp, "PYXIS_TEST_DOUBLE_CONTAINER", container_dir, 1);
	return 0;
}

/* remote, per task, as the user, after slurmstepd's own chdir to srun's cwd (which it does
 * after the privileged hook above, falling back to /tmp): --container-workdir wins, as with
 * pyxis */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	(void)sp; (void)ac; (void)av;
	if (!container_dir[0] || !opt_workdir)
		return 0;
	if (chdir(opt_workdir) < 0) {
		slurm_error("pyxis: error: cannot chdir to %s inside the container: %m", opt_workdir);
		return -1;
	}
	return 0;
}

/* remote, once per step when its tasks are done: an unnamed container goes away */
int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	(void)ac; (void)av;
	if (spank_remote(sp) && container_unnamed && container_dir[0]) {
		char *rm[] = {"/bin/rm", "-rf", container_dir, NULL};
		run_argv(rm);
	}
	return 0;
}

/* the job's end: its named containers go away (pyxis' default container_scope=job) */
int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
	(void)ac; (void)av;
	uint32_t job = 0;
	if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS || !job)
		return 0;
	char dir[PATH_MAX];
	snprintf(dir, sizeof(dir), "%s/job%u/%s", state_dir, job, node_name());
	char *rm[] = {"/bin/rm", "-rf", dir, NULL};
	run_argv(rm);
	snprintf(dir, sizeof(dir), "%s/job%u", state_dir, job);
	rmdir(dir); /* once the last node's directory is gone */
	return 0;
}
