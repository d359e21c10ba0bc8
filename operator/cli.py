"""`pagedinfer operator`: run the kopf operator with the package's handlers.

    pagedinfer operator --namespace team-a --namespace team-b
    pagedinfer operator --all-namespaces --liveness 0.0.0.0:8080 --metrics-port 9090

Heavy imports (kopf, aiohttp, prometheus-client) happen inside `run`, so
`pagedinfer --help` stays fast and works without the operator extra.
"""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "operator",
        help="run the Kubernetes operator (InferenceService -> sized engine Deployments)",
        description="Watch InferenceServices, size each engine's KV cache from node GPU memory, and "
        "reconcile them into Deployments and Services.",
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        metavar="NS",
        help="watch this namespace (repeatable; globs allowed, e.g. 'team-*')",
    )
    scope.add_argument(
        "--all-namespaces", "-A", action="store_true", help="watch every namespace (cluster-wide RBAC needed)"
    )
    p.add_argument(
        "--liveness", metavar="HOST:PORT", default=None, help="serve kopf's liveness probe at http://HOST:PORT/healthz"
    )
    p.add_argument(
        "--metrics-port", type=int, default=None, help="serve the operator's Prometheus metrics on this port"
    )
    peering = p.add_mutually_exclusive_group()
    peering.add_argument(
        "--standalone",
        action="store_true",
        help="run without kopf peering (the default without --peering; run one replica)",
    )
    peering.add_argument(
        "--peering",
        metavar="NAME",
        default=None,
        help="coordinate replicas through this kopf (Cluster)KopfPeering object: only the"
        " live replica of highest --priority handles resources, the others wait",
    )
    p.add_argument(
        "--priority",
        type=int,
        default=0,
        help="this replica's peering priority; give each replica its own (kopf freezes operators"
        " that share a priority) (default 0)",
    )
    p.add_argument(
        "--hf-endpoint",
        default=None,
        help="Hub endpoint for hf:// config.json (default $PAGEDINFER_HF_ENDPOINT, $HF_ENDPOINT or "
        "https://huggingface.co)",
    )
    p.add_argument(
        "--no-fetch-hf-config",
        action="store_true",
        help="never fetch config.json from the Hub (hf:// models then need architecture/configMapRef)",
    )
    p.add_argument(
        "--allow-host-path-models",
        action="store_true",
        help="accept file:// model URIs, mounted as hostPath volumes (off: anyone who may create an"
        " InferenceService could then read any node directory)",
    )
    p.add_argument(
        "--router-image",
        default=None,
        help="the router pods' image when spec.router.image is unset (default"
        " $PAGEDINFER_ROUTER_IMAGE or ghcr.io/pagedinfer/pagedinfer-router:0.1.0)",
    )
    p.add_argument(
        "--engine-image",
        default=None,
        help="the engine pods' image for services with GPUs when spec.engine.image is unset"
        " (default $PAGEDINFER_ENGINE_IMAGE or ghcr.io/pagedinfer/pagedinfer:0.1.0)",
    )
    p.add_argument(
        "--engine-cpu-image",
        default=None,
        help="the engine pods' image for `gpus: 0` services when spec.engine.image is unset"
        " (default $PAGEDINFER_ENGINE_CPU_IMAGE or ghcr.io/pagedinfer/pagedinfer:0.1.0-cpu)",
    )
    p.add_argument(
        "--retry-seconds", type=float, default=None, help="delay before retrying after an API error (default 15)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    import kopf

    from pagedinfer.operator import handlers  # noqa: F401  (registers the handlers)
    from pagedinfer.operator.registry import REGISTRY
    from pagedinfer.operator.settings import OperatorConfig, Runtime

    if not args.all_namespaces and not args.namespace:
        raise ValueError("--namespace: give at least one namespace, or --all-namespaces")
    if not _has_kubernetes_credentials():
        raise ValueError(
            "no Kubernetes credentials: run in a pod with a service account, or set KUBECONFIG"
            " (or create ~/.kube/config)"
        )
    if args.peering is None and args.priority:
        raise ValueError("--priority: only meaningful with --peering NAME")
    if args.liveness is not None and ":" not in args.liveness:
        raise ValueError(f"--liveness: expected HOST:PORT, got {args.liveness!r}")
    config = OperatorConfig.from_env(
        hf_endpoint=args.hf_endpoint,
        retry_delay_seconds=args.retry_seconds,
        router_image=args.router_image,
        engine_image=args.engine_image,
        engine_cpu_image=args.engine_cpu_image,
        **({"fetch_hf_config": False} if args.no_fetch_hf_config else {}),
        **({"allow_host_path_models": True} if args.allow_host_path_models else {}),
    )
    runtime = Runtime(config=config)
    if args.metrics_port is not None:
        runtime.metrics.serve(args.metrics_port)
    kopf.configure(verbose=False)
    asyncio.run(
        kopf.operator(
            registry=REGISTRY,
            memo=kopf.Memo(pagedinfer=runtime),
            standalone=args.peering is None,
            peering_name=args.peering,
            priority=args.priority,
            clusterwide=args.all_namespaces,
            namespaces=args.namespace,
            liveness_endpoint=f"http://{args.liveness}/healthz" if args.liveness else None,
        )
    )
    return 0


def _has_kubernetes_credentials() -> bool:
    """In a pod (service account) or with a kubeconfig file, as kopf's login handlers look for them."""
    import os
    from pathlib import Path

    if (
        os.environ.get("KUBERNETES_SERVICE_HOST")
        and Path("/var/run/secrets/kubernetes.io/serviceaccount/token").is_file()
    ):
        return True
    paths = os.environ.get("KUBECONFIG", "").split(os.pathsep) if os.environ.get("KUBECONFIG") else []
    paths = paths or [str(Path.home() / ".kube" / "config")]
    return any(Path(p).expanduser().is_file() for p in paths if p)
