// Package runtime is the local cluster's container runtime: what the kubelet (package kubelet)
// drives where a real Node has containerd or CRI-O.
//
// There is no image store. Images maps image references to local programs (RenderqueueImage:
// every image named .../renderqueue runs the renderqueue binary; PauseImage: registry.k8s.io/pause
// runs `sleep infinity`), with the parts of the image config that decide how a container runs
// (ENTRYPOINT, CMD, USER, ENV, WORKDIR).
//
// StartContainer starts a container instance from a ContainerConfig in new mount, UTS and IPC
// namespaces: its root filesystem is an overlay of this machine's root (read-only lower layer, a
// tmpfs as the container's writable layer) with a private /dev, /proc and /sys; the image's
// program and the volumes are bind-mounted at their paths; setpriv applies the user, groups,
// no_new_privs and the capability bounding set before the exec. There is no network, PID or user
// namespace and no cgroup.
//
// PodNetwork hands out the Pod IPs: a 10.244.N.0/24 made local to this machine with an AnyIP
// route on lo, so every Pod IP can be bound and reached without an interface per Pod.
//
// Starting containers and the pod network need root, Linux with overlayfs, util-linux (mount,
// umount, pivot_root, setpriv), coreutils and iproute2.
package runtime
