/* A stand-in for pyxis in the test Slurm (tests/support/slurm.py builds it with `cc`; needs Debian's libslurm-dev
 * for <slurm/spank.h>). Like pyxis, it is a SPANK plugin that adds --container-image, --container-mounts and
 * --container-workdir to srun (so `srun --help` lists them); like pyxis on a node without enroot, it fails the task's
 * plugin initialisation when --container-image is given. srun then prints "task 0 launch failed: Plugin
 * initialization failed" and, as observed with pyxis 0.24 built against Slurm 22.05, still exits 0. It runs nothing
 * and changes nothing else. */
#include <stddef.h>
#include <slurm/spank.h>

SPANK_PLUGIN(container_standin, 1);

static int image_given = 0;

static int on_image(int val, const char *optarg, int remote)
{
    (void) val; (void) optarg; (void) remote;
    image_given = 1;
    return 0;
}

static int on_other(int val, const char *optarg, int remote)
{
    (void) val; (void) optarg; (void) remote;
    return 0;
}

struct spank_option spank_options[] = {
    {"container-image", "IMAGE", "[test stand-in for pyxis] the image (no container is ever started)", 1, 0,
     on_image},
    {"container-mounts", "SRC:DST[,...]", "[test stand-in for pyxis] bind mounts", 1, 0, on_other},
    {"container-workdir", "PATH", "[test stand-in for pyxis] working directory", 1, 0, on_other},
    SPANK_OPTIONS_TABLE_END
};

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
    (void) ac; (void) av;
    if (spank_remote(sp) && image_given) {  /* on the node, where pyxis would start the container */
        slurm_error("container stand-in: no container runtime on this node");
        return -1;
    }
    return 0;
}
