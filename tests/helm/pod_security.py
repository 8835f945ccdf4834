"""A checker for the Kubernetes Pod Security Standards (baseline and restricted).

The rules are those of https://kubernetes.io/docs/concepts/security/pod-security-standards/,
control by control, for Linux pods; each violation names the control as that page does, the
field and the value. It reads a pod spec (a Pod's `spec`, or a pod template's) the way the
PodSecurity admission controller reads it, so the chart's operator pod and the webhook's injected
pods can be held to the `restricted` level that `pod-security.kubernetes.io/enforce=restricted`
enforces. The `restricted` level includes every `baseline` control.

Used by tests/helm/chart_test.py (the rendered operator Deployment) and tests/e2e/
readme_e2e_test.py (pods injected by the real webhook on a real node).
"""

# Baseline, "Capabilities": what containers may add.
BASELINE_ADDABLE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
# Restricted, "Capabilities": containers must drop ALL and may add back only this.
RESTRICTED_ADDABLE_CAPABILITIES = {"NET_BIND_SERVICE"}
# Baseline, "SELinux": the types a pod or container may set.
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
# Baseline, "Sysctls": the safe set.
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes"}
# Restricted, "Volume Types": the only volume sources allowed.
RESTRICTED_VOLUME_SOURCES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret"}
SECCOMP_CONFINED = {"RuntimeDefault", "Localhost"}


def _containers(spec):
    for kind in ("containers", "initContainers", "ephemeralContainers"):
        for container in spec.get(kind) or []:
            yield "spec.%s[%s]" % (kind, container.get("name", "?")), container


def check(spec, annotations=None, level="restricted"):
    """The violations of `level` ("baseline" or "restricted") by a pod spec, as a list of
    strings "<control>: <field> = <value>"; empty when the pod meets the level."""
    assert level in ("baseline", "restricted"), level
    annotations = annotations or {}
    found = []
    pod_context = spec.get("securityContext") or {}

    def violation(control, field, value):
        found.append("%s: %s = %r" % (control, field, value))

    # --- Baseline ---------------------------------------------------------------------------
    # HostProcess.
    if (pod_context.get("windowsOptions") or {}).get("hostProcess"):
        violation("HostProcess", "spec.securityContext.windowsOptions.hostProcess", True)
    # Host Namespaces.
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            violation("Host Namespaces", "spec." + field, spec[field])
    # HostPath Volumes.
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            violation("HostPath Volumes", "spec.volumes[%s].hostPath" % volume.get("name"),
                      volume["hostPath"])
    # AppArmor (annotations and fields).
    for key, value in annotations.items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
                value == "runtime/default" or value.startswith("localhost/")):
            violation("AppArmor", "metadata.annotations[%s]" % key, value)
    # SELinux, /proc Mount Type, Seccomp (baseline), Sysctls: pod level.
    contexts = [("spec.securityContext", pod_context)] + [
        (where + ".securityContext", container.get("securityContext") or {})
        for where, container in _containers(spec)]
    for where, context in contexts:
        apparmor = (context.get("appArmorProfile") or {}).get("type")
        if apparmor not in (None, "RuntimeDefault", "Localhost"):
            violation("AppArmor", where + ".appArmorProfile.type", apparmor)
        selinux = context.get("seLinuxOptions") or {}
        if "type" in selinux and selinux["type"] not in SELINUX_TYPES:
            violation("SELinux", where + ".seLinuxOptions.type", selinux["type"])
        for field in ("user", "role"):
            if selinux.get(field):
                violation("SELinux", where + ".seLinuxOptions." + field, selinux[field])
        seccomp = (context.get("seccompProfile") or {}).get("type")
        if seccomp == "Unconfined":
            violation("Seccomp", where + ".seccompProfile.type", seccomp)
    for sysctl in pod_context.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            violation("Sysctls", "spec.securityContext.sysctls[].name", sysctl.get("name"))
    for where, container in _containers(spec):
        context = container.get("securityContext") or {}
        # Privileged Containers.
        if context.get("privileged"):
            violation("Privileged Containers", where + ".securityContext.privileged", True)
        # HostProcess.
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            violation("HostProcess", where + ".securityContext.windowsOptions.hostProcess", True)
        # Capabilities (baseline).
        added = set((context.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_ADDABLE_CAPABILITIES:
            violation("Capabilities", where + ".securityContext.capabilities.add",
                      sorted(added - BASELINE_ADDABLE_CAPABILITIES))
        # Host Ports.
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                violation("Host Ports", where + ".ports[].hostPort", port["hostPort"])
        # /proc Mount Type.
        if context.get("procMount") not in (None, "Default"):
            violation("/proc Mount Type", where + ".securityContext.procMount",
                      context["procMount"])
    if level == "baseline":
        return found

    # --- Restricted -------------------------------------------------------------------------
    # Volume Types.
    for volume in spec.get("volumes") or []:
        sources = set(volume) - {"name"}
        if not sources <= RESTRICTED_VOLUME_SOURCES:
            violation("Volume Types", "spec.volumes[%s]" % volume.get("name"),
                      sorted(sources - RESTRICTED_VOLUME_SOURCES))
    pod_non_root = pod_context.get("runAsNonRoot")
    pod_seccomp = (pod_context.get("seccompProfile") or {}).get("type")
    # Running as Non-root user: runAsUser must not be 0 anywhere.
    if pod_context.get("runAsUser") == 0:
        violation("Running as Non-root user", "spec.securityContext.runAsUser", 0)
    if pod_non_root is False:
        violation("Running as Non-root", "spec.securityContext.runAsNonRoot", False)
    for where, container in _containers(spec):
        context = container.get("securityContext") or {}
        # Privilege Escalation: must be set to false.
        if context.get("allowPrivilegeEscalation") is not False:
            violation("Privilege Escalation", where + ".securityContext.allowPrivilegeEscalation",
                      context.get("allowPrivilegeEscalation"))
        # Running as Non-root: true on the container, or true on the pod and not false here.
        non_root = context.get("runAsNonRoot")
        if not (non_root is True or (non_root is None and pod_non_root is True)):
            violation("Running as Non-root", where + ".securityContext.runAsNonRoot", non_root)
        if context.get("runAsUser") == 0:
            violation("Running as Non-root user", where + ".securityContext.runAsUser", 0)
        # Seccomp: RuntimeDefault or Localhost on the container, or on the pod and unset here.
        seccomp = (context.get("seccompProfile") or {}).get("type")
        if not (seccomp in SECCOMP_CONFINED or (seccomp is None and pod_seccomp in
                                                SECCOMP_CONFINED)):
            violation("Seccomp", where + ".securityContext.seccompProfile.type", seccomp)
        # Capabilities: drop ALL, add at most NET_BIND_SERVICE.
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            violation("Capabilities", where + ".securityContext.capabilities.drop",
                      capabilities.get("drop"))
        added = set(capabilities.get("add") or [])
        if added - RESTRICTED_ADDABLE_CAPABILITIES:
            violation("Capabilities", where + ".securityContext.capabilities.add",
                      sorted(added - RESTRICTED_ADDABLE_CAPABILITIES))
    return found
