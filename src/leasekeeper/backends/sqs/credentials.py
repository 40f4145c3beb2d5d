"""What to tell a process that has no AWS credentials or region: the variables by
name, and where they are set (on a Spark cluster too).

A backend built from a spec (a Spark executor, the renewer process) takes its
credentials from its own environment, never from the spec; botocore's own words
("Unable to locate credentials") name neither the variables nor the place they go.
No text here quotes a credential: only the names of variables, profiles and settings.
"""

from __future__ import annotations

from leasekeeper.backends.environment import missing_variables

__all__ = [
    "AWS_KEYS",
    "AWS_REGION",
    "aws_configuration",
    "aws_credentials_problem",
    "aws_no_credentials",
    "aws_no_region",
    "aws_partial_credentials",
]

AWS_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
AWS_REGION = ("AWS_DEFAULT_REGION", "AWS_REGION")


def aws_no_credentials() -> str:
    """No AWS credentials anywhere in the chain boto3 searched."""
    return missing_variables("no AWS credentials in this process", AWS_KEYS) + (
        ", or AWS_PROFILE with a shared credentials file, or run it with an IAM role "
        "(an instance profile on the cluster's hosts, an EKS/ECS task role)"
    )


def aws_credentials_problem() -> str | None:
    """Why a client this process builds from its own environment would have no AWS
    credentials (botocore's chain: environment, profile, container, instance role),
    or None when the chain finds some."""
    import botocore.session

    if botocore.session.get_session().get_credentials() is None:
        return f"NoCredentialsError: {aws_no_credentials()}"
    return None


def aws_partial_credentials(missing: str | None) -> str:
    """Some of a credential set was found, not all (``missing``: the variable boto3 named)."""
    what = f"partial AWS credentials in this process (missing {missing or 'a value'})"
    return missing_variables(what, AWS_KEYS)


def aws_no_region() -> str:
    return (
        missing_variables("no AWS region in this process", AWS_REGION, joiner="or")
        + ", or pass region=..."
    )


def aws_configuration(exc: BaseException) -> str:
    """What a botocore configuration error (NoCredentialsError, NoRegionError...)
    means and how to fix it. Reads only the names botocore keeps in ``kwargs``."""
    name = type(exc).__name__
    kwargs = getattr(exc, "kwargs", None)
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    if name == "NoCredentialsError":
        return aws_no_credentials()
    if name == "PartialCredentialsError":
        missing = kwargs.get("cred_var")
        return aws_partial_credentials(missing if isinstance(missing, str) else None)
    if name == "NoRegionError":
        return aws_no_region()
    if name == "ProfileNotFound":
        return f"the AWS profile {kwargs.get('profile')!r} is not in this process's config files"
    return "the client is not configured to reach the service (credentials, profile or region)"
