"""Google Highway, pinned by version and sha256.

The source is Debian's orig tarball of highway (the release archive). It is fetched from the Debian
mirror named in this machine's apt configuration (never a host written in this repo), or from
$MLLM_KERNEL_DEBIAN_MIRROR where apt is absent. Bazel's --distdir / repository cache also satisfy
it offline, keyed by the sha256.
"""

HIGHWAY_VERSION = "1.3.0"
HIGHWAY_SHA256 = "07b3c1ba2c1096878a85a31a5b9b3757427af963b1141ca904db2f9f4afe0bc2"
_POOL_PATH = "pool/main/h/highway/highway_{v}.orig.tar.gz"

def debian_mirrors(rctx):
    """Debian mirror URLs (ending in '/') from $MLLM_KERNEL_DEBIAN_MIRROR or apt's configuration."""
    mirrors = []
    env = rctx.os.environ.get("MLLM_KERNEL_DEBIAN_MIRROR", "")
    if env:
        mirrors.append(env.rstrip("/") + "/")
    if rctx.which("apt-get"):
        res = rctx.execute([
            "apt-get",
            "indextargets",
            "--format",
            "$(REPO_URI) $(COMPONENT)",
            "Created-By: Packages",
        ])
        for line in res.stdout.splitlines():
            parts = line.split(" ")
            if len(parts) == 2 and parts[1] == "main" and "security" not in parts[0]:
                url = parts[0].rstrip("/") + "/"
                if url not in mirrors:
                    mirrors.append(url)
    return mirrors

def _highway_repo_impl(rctx):
    mirrors = debian_mirrors(rctx)
    if not mirrors:
        fail("highway: no Debian mirror found in apt's configuration; set MLLM_KERNEL_DEBIAN_MIRROR")
    rctx.download_and_extract(
        url = [m + _POOL_PATH.format(v = HIGHWAY_VERSION) for m in mirrors],
        sha256 = HIGHWAY_SHA256,
        stripPrefix = "highway-" + HIGHWAY_VERSION,
    )

    # Highway's own BUILD needs googletest and more; ours builds just the runtime library.
    rctx.delete("BUILD")
    rctx.delete("MODULE.bazel")
    rctx.delete("WORKSPACE")
    rctx.symlink(rctx.attr.build_file, "BUILD.bazel")
    rctx.file("version.bzl", "HIGHWAY_VERSION = %r\n" % HIGHWAY_VERSION)

highway_repo = repository_rule(
    implementation = _highway_repo_impl,
    attrs = {"build_file": attr.label(default = "//tools/highway:highway.BUILD")},
    environ = ["MLLM_KERNEL_DEBIAN_MIRROR"],
)

def _highway_impl(_mctx):
    highway_repo(name = "highway")

highway = module_extension(implementation = _highway_impl)
